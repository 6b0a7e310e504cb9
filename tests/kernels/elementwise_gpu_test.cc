// The CUDA backend's elementwise, SwiGLU and RMSNorm kernels against the CPU backend on
// the same inputs through the same ops:: calls: what is written and what is added into
// must match (the added-into outputs start from non-zero values), at odd sizes (1, a
// partial block, rows wider than a block). Skips without a GPU.
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/swiglu.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {

using testing::f;
using testing::randn;
using testing::same_on_both;

TEST(CudaKernels, ElementwiseMatchCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 255, 257, 100003}) {
    const auto z = static_cast<std::size_t>(n);
    same_on_both({randn(z, 1), randn(z, 2), randn(z, 3)}, [n](Device& dev, std::vector<Buffer>& b) {
      Stream& s = dev.compute_stream();
      ops::axpy(dev, s, f(b[0]), f(b[1]), n, 0.5f);
      ops::scale(dev, s, f(b[1]), n, -3.0f);
      ops::add(dev, s, f(b[2]), f(b[0]), f(b[1]), n);
    }, 1e-6f, "axpy/scale/add n " + std::to_string(n));
    same_on_both({randn(z, 4)}, [n](Device& dev, std::vector<Buffer>& b) {
      ops::fill(dev, dev.compute_stream(), f(b[0]), n, 1.25f);
    }, 0.0f, "fill");
  }
}

TEST(CudaKernels, SwigluMatchesCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 1000, 65537}) {
    const auto z = static_cast<std::size_t>(n);
    same_on_both({randn(z, 5), randn(z, 6), randn(z, 7), randn(z, 8), randn(z, 9), randn(z, 10)},
                 [n](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::swiglu_forward(dev, s, f(b[0]), f(b[1]), f(b[2]), n);
                   ops::swiglu_backward(dev, s, f(b[3]), f(b[4]), f(b[5]), f(b[1]), f(b[2]), n);
                 }, 2e-6f, "swiglu n " + std::to_string(n));
  }
}

TEST(CudaKernels, RmsnormMatchesCpuAndAddsIntoItsGradients) {
  PB_NEED_GPU();
  for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 7}, {17, 256}, {5, 1000}, {64, 4099}}) {
    const auto nc = static_cast<std::size_t>(n * c), zc = static_cast<std::size_t>(c), zn = static_cast<std::size_t>(n);
    // x, weight, out, rstd, dout, dx (starts non-zero: added into), dweight (likewise)
    same_on_both({randn(nc, 11), randn(zc, 12), randn(nc, 13), randn(zn, 14), randn(nc, 15), randn(nc, 16), randn(zc, 17)},
                 [n, c](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::rmsnorm_forward(dev, s, f(b[2]), f(b[3]), f(b[0]), f(b[1]), n, c, 1e-5f);
                   ops::rmsnorm_backward(dev, s, f(b[5]), f(b[6]), f(b[4]), f(b[0]), f(b[1]), f(b[3]), n, c);
                 }, 1e-5f, "rmsnorm " + std::to_string(n) + "x" + std::to_string(c));
  }
}

}  // namespace
}  // namespace peakbound
