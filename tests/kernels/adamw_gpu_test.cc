// The CUDA backend's AdamW update against the CPU backend's (the same scalars, every
// gradient/parameter dtype pair): master, m, v and the parameters bitwise equal; the sum
// of squares equal to double rounding. Skips without a GPU.
#include <cstring>

#include "peakbound/core/thread_pool.h"
#include "peakbound/ops/adamw.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::f;
using testing::randn;
using testing::same_on_both;

TEST(CudaKernels, AdamwUpdateIsBitwiseTheCpuOne) {
  PB_NEED_GPU();
  ThreadPool pool(2);
  const ops::AdamWLaunch launch{&pool, SimdLevel::scalar};
  const AdamWStepScalars sc = adamw_step_scalars(AdamWConfig{}, 3, 1e-3f, 0.7f);
  const std::int64_t n = 100003;
  const auto z = static_cast<std::size_t>(n);
  for (DType g : {DType::f32, DType::bf16})
    for (DType p : {DType::f32, DType::bf16}) {
      std::vector<float> v = randn(z, 3);
      for (float& x : v) x = x * x;  // the second moment is >= 0
      std::vector<float> grad = randn(z, 4);
      if (g == DType::bf16) {  // n bf16 gradients (finite) in the first half of the buffer
        const std::vector<float> vals = randn(z, 6);
        std::vector<bf16> h(z);
        for (std::size_t i = 0; i < z; ++i) h[i] = to_bf16(vals[i]);
        std::memcpy(grad.data(), h.data(), z * sizeof(bf16));
      }
      std::vector<double> norms(2);
      int which = 0;
      // master, m, v, grad (f32 or bf16 bits in a float buffer), param
      same_on_both({randn(z, 1), randn(z, 2), v, grad, randn(z, 5)}, [&](Device& dev, std::vector<Buffer>& b) {
        Stream& s = dev.compute_stream();
        AdamWTensors t{f(b[0]), f(b[1]), f(b[2]), b[3].data(), g, b[4].data(), p, n};
        ops::adamw_update(dev, s, sc, t, launch);
        norms[static_cast<std::size_t>(which++)] = ops::sum_squares(dev, s, b[3].data(), g, n, launch);
      }, 0.0f, std::string("adamw ") + std::string(dtype_name(g)) + "/" + std::string(dtype_name(p)));
      EXPECT_NEAR(norms[1], norms[0], 1e-12 * norms[0]);
    }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
