// The residual MLP block the checkpoint schedules run: forward against a naive double
// reference, backward against finite differences of that reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/layers/residual_mlp_block.h"
#include "tests/layers/reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::int64_t T = 5, H = 6, F = 10;

// y = x + W_down (silu(W_gate n) * (W_up n)), n = rmsnorm(x) * w, all in double.
std::vector<double> naive_forward(const std::vector<double>& x, const std::vector<std::vector<double>>& p, double eps) {
  const auto& w = p[0];
  const auto& wg = p[1];
  const auto& wu = p[2];
  const auto& wd = p[3];
  std::vector<double> y(x), norm, rstd;
  reference::rms_fwd(x, w, H, eps, norm, rstd);
  for (std::int64_t t = 0; t < T; ++t) {
    const double* n = norm.data() + t * H;
    std::vector<double> a(F);
    for (std::int64_t f = 0; f < F; ++f) {
      double g = 0, u = 0;
      for (std::int64_t j = 0; j < H; ++j) {
        g += wg[f * H + j] * n[j];
        u += wu[f * H + j] * n[j];
      }
      a[f] = g / (1.0 + std::exp(-g)) * u;
    }
    for (std::int64_t j = 0; j < H; ++j)
      for (std::int64_t f = 0; f < F; ++f) y[t * H + j] += wd[j * F + f] * a[f];
  }
  return y;
}

struct Fixture {
  CpuDevice dev{64 << 20};
  ResidualMlpBlock block{dev, H, F, 5};
  Buffer x = dev.allocate(Component::layer, T * H * 4);
  Buffer y = dev.allocate(Component::layer, T * H * 4);
  Buffer dy = dev.allocate(Component::layer, T * H * 4);
  Buffer dx = dev.allocate(Component::layer, T * H * 4);
  Tensor tx = x.tensor(Shape{T, H}, DType::f32), ty = y.tensor(Shape{T, H}, DType::f32);
  Tensor tdy = dy.tensor(Shape{T, H}, DType::f32), tdx = dx.tensor(Shape{T, H}, DType::f32);

  Fixture() {
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (std::int64_t i = 0; i < T * H; ++i) {
      x.as<float>()[i] = d(rng);
      dy.as<float>()[i] = d(rng);
    }
  }
  std::vector<double> xd() const { return {x.as<float>(), x.as<float>() + T * H}; }
  std::vector<std::vector<double>> params() const {
    std::vector<std::vector<double>> out;
    for (const Parameter& p : block.parameters())
      out.emplace_back(p.value.data<float>(), p.value.data<float>() + p.value.numel());
    return out;
  }
  double loss(const std::vector<double>& xv, const std::vector<std::vector<double>>& pv) const {
    auto out = naive_forward(xv, pv, block.eps());
    double s = 0;
    for (std::int64_t i = 0; i < T * H; ++i) s += dy.as<float>()[i] * out[i];
    return s;
  }
};

std::vector<float> central_difference(std::vector<double>& v, const std::function<double()>& f) {
  const double h = 1e-4;
  std::vector<float> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = f();
    v[i] = keep - h;
    const double down = f();
    v[i] = keep;
    g[i] = static_cast<float>((up - down) / (2 * h));
  }
  return g;
}

TEST(ResidualMlpBlock, ForwardMatchesNaiveDouble) {
  Fixture fx;
  fx.block.forward(fx.tx, fx.ty);
  auto want = naive_forward(fx.xd(), fx.params(), fx.block.eps());
  std::vector<float> wantf(want.begin(), want.end());
  EXPECT_LT(cpu::relative_error(fx.y.as<float>(), wantf.data(), T * H), 1e-5);
  // The MLP branch is not negligible, so the test sees more than the residual copy.
  EXPECT_GT(cpu::max_abs_diff(fx.y.as<float>(), fx.x.as<float>(), T * H), 0.1);
}

TEST(ResidualMlpBlock, BackwardMatchesFiniteDifferencesForInputAndEveryParameter) {
  Fixture fx;
  fx.block.backward(fx.tx, fx.tdy, fx.tdx);
  auto xv = fx.xd();
  auto pv = fx.params();
  auto fdx = central_difference(xv, [&] { return fx.loss(xv, pv); });
  EXPECT_LT(cpu::relative_error(fx.dx.as<float>(), fdx.data(), T * H), 1e-5);
  auto params = fx.block.parameters();
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto fd = central_difference(pv[k], [&] { return fx.loss(xv, pv); });
    EXPECT_LT(cpu::relative_error(params[k].grad.data<float>(), fd.data(), params[k].grad.numel()), 1e-5)
        << params[k].name;
  }
}

TEST(ResidualMlpBlock, BackwardAddsIntoParameterGradients) {
  Fixture fx;
  fx.block.backward(fx.tx, fx.tdy, fx.tdx);
  std::vector<std::vector<float>> once;
  for (const Parameter& p : fx.block.parameters()) once.emplace_back(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel());
  fx.block.backward(fx.tx, fx.tdy, fx.tdx);
  auto params = fx.block.parameters();
  for (std::size_t k = 0; k < params.size(); ++k)
    for (std::int64_t i = 0; i < params[k].grad.numel(); ++i)
      EXPECT_FLOAT_EQ(params[k].grad.data<float>()[i], 2.0f * once[k][static_cast<std::size_t>(i)]) << params[k].name;
  fx.block.zero_grad();
  for (const Parameter& p : fx.block.parameters()) EXPECT_EQ(cpu::max_abs(p.grad.data<float>(), p.grad.numel()), 0.0);
}

TEST(ResidualMlpBlock, InternalsAreFreedAndAccountedAsLayer) {
  Fixture fx;
  const std::uint64_t live = fx.dev.arena().live();
  fx.dev.arena().reset_peaks();
  fx.block.backward(fx.tx, fx.tdy, fx.tdx);
  EXPECT_EQ(fx.dev.arena().live(), live);  // nothing outlives the call
  EXPECT_GT(fx.dev.arena().peak(Component::layer), fx.dev.arena().live(Component::layer));
  EXPECT_THROW(ResidualMlpBlock(fx.dev, 0, F, 1), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
