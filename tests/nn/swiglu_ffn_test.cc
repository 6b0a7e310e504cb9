// The SwiGLU FFN written once (nn/swiglu_ffn.h): forward and backward against a
// naive double reference, write vs add-into semantics, dx aliasing x, and m = 0.
#include "peakbound/nn/swiglu_ffn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound {
namespace {

constexpr std::int64_t M = 3, H = 5, F = 7;

std::vector<float> randn(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

struct Reference {
  std::vector<double> out, dx, dwg, dwu, dwd;
};

// out = (silu(x Wg^T) * (x Wu^T)) Wd^T and its gradients for dout, in double.
Reference reference(const std::vector<float>& x, const std::vector<float>& wg, const std::vector<float>& wu,
                    const std::vector<float>& wd, const std::vector<float>& dout) {
  Reference r;
  r.out.assign(M * H, 0);
  r.dx.assign(M * H, 0);
  r.dwg.assign(F * H, 0);
  r.dwu.assign(F * H, 0);
  r.dwd.assign(H * F, 0);
  for (std::int64_t i = 0; i < M; ++i) {
    std::vector<double> g(F), u(F), a(F), da(F), dg(F), du(F);
    for (std::int64_t f = 0; f < F; ++f) {
      for (std::int64_t j = 0; j < H; ++j) {
        g[f] += double(x[i * H + j]) * wg[f * H + j];
        u[f] += double(x[i * H + j]) * wu[f * H + j];
      }
      a[f] = silu(g[f]) * u[f];
    }
    for (std::int64_t j = 0; j < H; ++j)
      for (std::int64_t f = 0; f < F; ++f) {
        r.out[i * H + j] += wd[j * F + f] * a[f];
        r.dwd[j * F + f] += dout[i * H + j] * a[f];
        da[f] += dout[i * H + j] * double(wd[j * F + f]);
      }
    for (std::int64_t f = 0; f < F; ++f) {
      const double s = 1.0 / (1.0 + std::exp(-g[f]));
      dg[f] = da[f] * u[f] * (s + g[f] * s * (1 - s));
      du[f] = da[f] * silu(g[f]);
      for (std::int64_t j = 0; j < H; ++j) {
        r.dwg[f * H + j] += dg[f] * x[i * H + j];
        r.dwu[f * H + j] += du[f] * x[i * H + j];
        r.dx[i * H + j] += dg[f] * wg[f * H + j] + du[f] * wu[f * H + j];
      }
    }
  }
  return r;
}

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  std::vector<float> w(want.begin(), want.end());
  return cpu::relative_error(got.data(), w.data(), static_cast<std::int64_t>(w.size()));
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<float>& b) {
  std::vector<double> r(a);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] += b[i];
  return r;
}

TEST(SwigluFfn, ForwardAndBackwardMatchNaiveDouble) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  auto x = randn(M * H, 1), wg = randn(F * H, 2), wu = randn(F * H, 3), wd = randn(H * F, 4), dout = randn(M * H, 5);
  const Reference ref = reference(x, wg, wu, wd, dout);
  const SwigluFfnWeights w{wg.data(), wu.data(), wd.data()};
  std::vector<float> gate(M * F), up(M * F), act(M * F), out(M * H, 123.0f);

  swiglu_ffn_forward(dev, s, M, H, F, x.data(), w, gate.data(), up.data(), act.data(), out.data(), false);
  EXPECT_LT(rel(out, ref.out), 1e-5);  // written: the 123s are gone
  const auto base = randn(M * H, 6);
  std::vector<float> acc = base;
  swiglu_ffn_forward(dev, s, M, H, F, x.data(), w, gate.data(), up.data(), act.data(), acc.data(), true);
  EXPECT_LT(rel(acc, plus(ref.out, base)), 1e-5);  // added into

  // Backward adds into dW (pre-filled), writes dx; then adds into dx.
  const auto g0 = randn(F * H, 7), u0 = randn(F * H, 8), d0 = randn(H * F, 9);
  std::vector<float> dwg = g0, dwu = u0, dwd = d0, dx(M * H, 55.0f);
  swiglu_ffn_backward(dev, s, M, H, F, x.data(), w, dout.data(), gate.data(), up.data(), act.data(),
                      {dwg.data(), dwu.data(), dwd.data()}, dx.data(), false);
  EXPECT_LT(rel(dx, ref.dx), 1e-5);
  EXPECT_LT(rel(dwg, plus(ref.dwg, g0)), 1e-5);
  EXPECT_LT(rel(dwu, plus(ref.dwu, u0)), 1e-5);
  EXPECT_LT(rel(dwd, plus(ref.dwd, d0)), 1e-5);

  swiglu_ffn_forward(dev, s, M, H, F, x.data(), w, gate.data(), up.data(), act.data(), nullptr, false);
  std::vector<float> dx_acc = base;
  swiglu_ffn_backward(dev, s, M, H, F, x.data(), w, dout.data(), gate.data(), up.data(), act.data(),
                      {dwg.data(), dwu.data(), dwd.data()}, dx_acc.data(), true);
  EXPECT_LT(rel(dx_acc, plus(ref.dx, base)), 1e-5);
}

TEST(SwigluFfn, DxMayAliasX) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  auto x = randn(M * H, 1), wg = randn(F * H, 2), wu = randn(F * H, 3), wd = randn(H * F, 4), dout = randn(M * H, 5);
  const SwigluFfnWeights w{wg.data(), wu.data(), wd.data()};
  std::vector<float> gate(M * F), up(M * F), act(M * F), dwg(F * H), dwu(F * H), dwd(H * F), dx(M * H);
  swiglu_ffn_forward(dev, s, M, H, F, x.data(), w, gate.data(), up.data(), act.data(), nullptr, false);
  swiglu_ffn_backward(dev, s, M, H, F, x.data(), w, dout.data(), gate.data(), up.data(), act.data(),
                      {dwg.data(), dwu.data(), dwd.data()}, dx.data(), false);
  std::vector<float> x2 = x, dwg2(F * H), dwu2(F * H), dwd2(H * F);
  swiglu_ffn_forward(dev, s, M, H, F, x2.data(), w, gate.data(), up.data(), act.data(), nullptr, false);
  swiglu_ffn_backward(dev, s, M, H, F, x2.data(), w, dout.data(), gate.data(), up.data(), act.data(),
                      {dwg2.data(), dwu2.data(), dwd2.data()}, x2.data(), false);
  EXPECT_EQ(x2, dx);  // bitwise: aliasing changes nothing
  EXPECT_EQ(dwg2, dwg);
  EXPECT_EQ(dwu2, dwu);
}

TEST(SwigluFfn, ZeroRowsTouchNothingAndBuffersAreMByF) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  auto wg = randn(F * H, 2), wu = randn(F * H, 3), wd = randn(H * F, 4);
  std::vector<float> dwg(F * H, 1.0f), dwu(F * H, 1.0f), dwd(H * F, 1.0f);
  swiglu_ffn_forward(dev, s, 0, H, F, nullptr, {wg.data(), wu.data(), wd.data()}, nullptr, nullptr, nullptr, nullptr,
                     false);
  swiglu_ffn_backward(dev, s, 0, H, F, nullptr, {wg.data(), wu.data(), wd.data()}, nullptr, nullptr, nullptr, nullptr,
                      {dwg.data(), dwu.data(), dwd.data()}, nullptr, true);
  EXPECT_EQ(dwg, std::vector<float>(F * H, 1.0f));
  const SwigluFfnBuffers b = swiglu_ffn_buffers(37, 22, 2);
  EXPECT_EQ(b.gate.bytes, 37u * 22 * 2);
  EXPECT_EQ(b.act.component, Component::layer);
  EXPECT_EQ(b.reserved(), 3 * arena_reserved(37 * 22 * 2));
  EXPECT_EQ(swiglu_ffn_buffers(0, 22, 4, Component::dispatch).reserved(), 0u);
}

}  // namespace
}  // namespace peakbound
