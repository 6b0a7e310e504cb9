// ops::gemm on the CUDA device (cuBLAS) against the CPU device (OpenBLAS) on the same
// inputs: every transpose combination, written and added into, odd shapes, k = 0,
// and strides wider than the rows. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/device/cuda/cuda_device.h"
#include "peakbound/ops/gemm.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Case {
  bool ta, tb;
  std::int64_t m, n, k, pad;
  float beta;
};

void product(Device& dev, const Case& c, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* out,
             std::int64_t ldc) {
  ops::gemm(dev, dev.compute_stream(), c.ta, c.tb, c.m, c.n, c.k, 0.75f, a, lda, b, ldb, c.beta, out, ldc);
}
void product(Device& dev, const Case& c, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float* out,
             std::int64_t ldc) {
  ops::gemm_bf16(dev, dev.compute_stream(), c.ta, c.tb, c.m, c.n, c.k, 0.75f, a, lda, b, ldb, c.beta, out, ldc);
}

// The product with T operands (f32: ops::gemm; bf16: ops::gemm_bf16, operands rounded
// once on the host so both devices read the same bits) and an f32 C, on both devices:
// cuBLAS's fp32 accumulation against the CPU backend's, f32 tolerance.
template <typename T>
void expect_gpu_matches_cpu(std::uint32_t seed) {
  CudaDevice gpu(256 * testing::kMiB);
  CpuDevice cpu(256 * testing::kMiB);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (Case c : {Case{false, false, 1, 1, 1, 0, 0}, Case{false, true, 33, 17, 65, 0, 0}, Case{true, false, 7, 129, 3, 2, 1},
                 Case{true, true, 64, 48, 256, 5, 1}, Case{false, false, 5, 9, 0, 0, 1}, Case{false, true, 300, 257, 31, 3, 0}}) {
    const std::int64_t ar = c.ta ? c.k : c.m, ac = (c.ta ? c.m : c.k) + c.pad;
    const std::int64_t br = c.tb ? c.n : c.k, bc = (c.tb ? c.k : c.n) + c.pad;
    const std::int64_t ldc = c.n + c.pad;
    std::vector<T> a(static_cast<std::size_t>(ar * ac)), b(static_cast<std::size_t>(br * bc));
    std::vector<float> c0(static_cast<std::size_t>(c.m * ldc));
    for (auto* v : {&a, &b})
      for (T& x : *v) x = narrow<T>(nd(rng));
    for (float& x : c0) x = nd(rng);
    auto run = [&](Device& dev) {
      Buffer da = testing::upload(dev, a), db = testing::upload(dev, b), dc = testing::upload(dev, c0);
      product(dev, c, static_cast<const T*>(da.data()), ac, static_cast<const T*>(db.data()), bc, testing::f(dc), ldc);
      return testing::download(dev, dc, c0.size());
    };
    const std::vector<float> want = run(cpu), got = run(gpu);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i])) * static_cast<float>(1 + c.k))
          << "m " << c.m << " n " << c.n << " k " << c.k << " element " << i;
  }
}

TEST(CudaGemm, MatchesTheCpuBackend) {
  PB_NEED_GPU();
  expect_gpu_matches_cpu<float>(7);
}

// The mixed-precision product.
TEST(CudaGemm, Bf16MatchesTheCpuBackend) {
  PB_NEED_GPU();
  expect_gpu_matches_cpu<bf16>(9);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
