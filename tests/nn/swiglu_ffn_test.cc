// The SwiGLU FFN written once (nn/swiglu_ffn.h): forward and backward against a
// naive double reference, write vs add-into semantics, dx aliasing x, and m = 0; the
// bf16 form against the f32 form on the widened inputs, and its buffers.
#include "peakbound/nn/swiglu_ffn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/gemm.h"
#include "tests/layers/layer_checks.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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

// --- bf16 -------------------------------------------------------------------------

std::vector<bf16> narrow_all(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
  return r;
}

std::vector<float> widen_all(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = to_f32(v[i]);
  return r;
}

// max|got - ref| / max|ref|
double max_relative(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return err / scale;
}

using layer_test::cosine;

double norm_ratio(const std::vector<float>& a, const std::vector<float>& b) {
  double aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return std::sqrt(aa / bb);
}

std::vector<float> times(std::vector<float> v, float a) {
  for (float& x : v) x *= a;
  return v;
}

// Sizes that cross the 256-row linear tile, with H != F so the tile's width matters.
constexpr std::int64_t MB = 300, HB = 48, FB = 80;

struct Bf16Inputs {
  std::vector<bf16> x, wg, wu, wd, dout, base;
  Bf16Inputs() {
    x = narrow_all(randn(MB * HB, 41));
    wg = narrow_all(times(randn(FB * HB, 42), 1.0f / std::sqrt(float(HB))));
    wu = narrow_all(times(randn(FB * HB, 43), 1.0f / std::sqrt(float(HB))));
    wd = narrow_all(times(randn(HB * FB, 44), 1.0f / std::sqrt(float(FB))));
    dout = narrow_all(randn(MB * HB, 45));
    base = narrow_all(randn(MB * HB, 46));
  }
};

// The bf16 FFN's buffers as swiglu_ffn_buffers sizes them.
struct Bf16Scratch {
  std::vector<bf16> gate, up, act;
  std::vector<float> tile;
  Bf16Scratch() {
    const SwigluFfnBuffers b = swiglu_ffn_buffers(MB, HB, FB, Precision::bf16);
    gate.resize(b.gate.bytes / sizeof(bf16));
    up.resize(b.up.bytes / sizeof(bf16));
    act.resize(b.act.bytes / sizeof(bf16));
    tile.resize(b.tile.bytes / sizeof(float));
  }
};

// Bounds. Each bf16 activation the FFN stores (gate, up, act, out; dact, dgate, dup, dx)
// rounds once, by at most 2^-9 = 1.95e-3 relative, and a value passes through at most
// about four such roundings on its way to out or dx (the GEMMs' fp32 sums differ from
// sgemm's only in order, ~1e-6), so outputs and dx stay within 1e-2 of the f32 FFN on the
// same (widened) inputs, normalized by the largest reference value. A weight gradient is
// an fp32 sum over 300 rows of products of such rounded activations: the rounding errors
// are independent and do not line up with the gradient, so its direction moves by about
// 2^-9 / sqrt(rows) and its cosine with the f32 gradient stays >= 0.9999.
TEST(SwigluFfnBf16, MatchesF32OnWidenedInputs) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  const std::string before = ops::bf16_gemm_path();
  const Bf16Inputs in;
  const SwigluFfnWeightsBf16 w{in.wg.data(), in.wu.data(), in.wd.data()};
  // The f32 FFN on the widened bf16 values: the reference.
  const auto x = widen_all(in.x), wg = widen_all(in.wg), wu = widen_all(in.wu), wd = widen_all(in.wd);
  const auto dout = widen_all(in.dout), base = widen_all(in.base);
  const SwigluFfnWeights w32{wg.data(), wu.data(), wd.data()};
  std::vector<float> g32(MB * FB), u32(MB * FB), a32(MB * FB), out32(MB * HB), acc32 = base;
  std::vector<float> dwg32(FB * HB), dwu32(FB * HB), dwd32(HB * FB), dx32(MB * HB), dxacc32 = base;
  swiglu_ffn_forward(dev, s, MB, HB, FB, x.data(), w32, g32.data(), u32.data(), a32.data(), acc32.data(), true);
  swiglu_ffn_forward(dev, s, MB, HB, FB, x.data(), w32, g32.data(), u32.data(), a32.data(), out32.data(), false);
  swiglu_ffn_backward(dev, s, MB, HB, FB, x.data(), w32, dout.data(), g32.data(), u32.data(), a32.data(),
                      {dwg32.data(), dwu32.data(), dwd32.data()}, dx32.data(), false);
  swiglu_ffn_forward(dev, s, MB, HB, FB, x.data(), w32, g32.data(), u32.data(), a32.data(), nullptr, false);
  swiglu_ffn_backward(dev, s, MB, HB, FB, x.data(), w32, dout.data(), g32.data(), u32.data(), a32.data(),
                      {dwg32.data(), dwu32.data(), dwd32.data()}, dxacc32.data(), true);
  dev.synchronize(s);
  const std::vector<float> ref_dwg = times(dwg32, 0.5f), ref_dwu = times(dwu32, 0.5f), ref_dwd = times(dwd32, 0.5f);

  for (cpu::Bf16GemmPath p : {cpu::Bf16GemmPath::convert, cpu::Bf16GemmPath::native}) {
    if (!cpu::bf16_gemm_path_supported(p)) continue;
    SCOPED_TRACE(std::string("path ") + std::string(cpu::bf16_gemm_path_name(p)));
    ops::set_bf16_gemm_path(cpu::bf16_gemm_path_name(p));
    Bf16Scratch t;
    std::vector<bf16> out(MB * HB, to_bf16(123.0f)), acc = in.base, dx(MB * HB, to_bf16(55.0f)), dx_acc = in.base;
    std::vector<float> dwg(FB * HB), dwu(FB * HB), dwd(HB * FB);
    swiglu_ffn_forward(dev, s, MB, HB, FB, in.x.data(), w, t.gate.data(), t.up.data(), t.act.data(), acc.data(), true,
                       t.tile.data());
    swiglu_ffn_forward(dev, s, MB, HB, FB, in.x.data(), w, t.gate.data(), t.up.data(), t.act.data(), out.data(), false,
                       t.tile.data());
    swiglu_ffn_backward(dev, s, MB, HB, FB, in.x.data(), w, in.dout.data(), t.gate.data(), t.up.data(), t.act.data(),
                        {dwg.data(), dwu.data(), dwd.data()}, dx.data(), false, t.tile.data());
    dev.synchronize(s);
    EXPECT_LE(max_relative(widen_all(out), out32), 1e-2);  // written: the 123s are gone
    EXPECT_LE(max_relative(widen_all(acc), acc32), 1e-2);  // added into
    EXPECT_LE(max_relative(widen_all(dx), dx32), 1e-2);    // written: the 55s are gone
    EXPECT_GE(cosine(dwg, ref_dwg), 0.9999);
    EXPECT_GE(cosine(dwu, ref_dwu), 0.9999);
    EXPECT_GE(cosine(dwd, ref_dwd), 0.9999);
    // A second backward (on a recomputed forward) adds into dW again and into dx.
    swiglu_ffn_forward(dev, s, MB, HB, FB, in.x.data(), w, t.gate.data(), t.up.data(), t.act.data(), nullptr, false,
                       t.tile.data());
    swiglu_ffn_backward(dev, s, MB, HB, FB, in.x.data(), w, in.dout.data(), t.gate.data(), t.up.data(), t.act.data(),
                        {dwg.data(), dwu.data(), dwd.data()}, dx_acc.data(), true, t.tile.data());
    dev.synchronize(s);
    EXPECT_LE(max_relative(widen_all(dx_acc), dxacc32), 1e-2);
    for (const auto& [got, want] : {std::pair{&dwg, &dwg32}, std::pair{&dwu, &dwu32}, std::pair{&dwd, &dwd32}}) {
      EXPECT_GE(cosine(*got, *want), 0.9999);
      EXPECT_NEAR(norm_ratio(*got, *want), 1.0, 1e-2);
    }
  }
  ops::set_bf16_gemm_path(before);
}

TEST(SwigluFfnBf16, DxMayAliasX) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  const Bf16Inputs in;
  const SwigluFfnWeightsBf16 w{in.wg.data(), in.wu.data(), in.wd.data()};
  Bf16Scratch t;
  std::vector<float> dwg(FB * HB), dwu(FB * HB), dwd(HB * FB), dwg2(FB * HB), dwu2(FB * HB), dwd2(HB * FB);
  std::vector<bf16> dx(MB * HB), x2 = in.x;
  swiglu_ffn_forward(dev, s, MB, HB, FB, in.x.data(), w, t.gate.data(), t.up.data(), t.act.data(), nullptr, false,
                     t.tile.data());
  swiglu_ffn_backward(dev, s, MB, HB, FB, in.x.data(), w, in.dout.data(), t.gate.data(), t.up.data(), t.act.data(),
                      {dwg.data(), dwu.data(), dwd.data()}, dx.data(), false, t.tile.data());
  swiglu_ffn_forward(dev, s, MB, HB, FB, x2.data(), w, t.gate.data(), t.up.data(), t.act.data(), nullptr, false,
                     t.tile.data());
  swiglu_ffn_backward(dev, s, MB, HB, FB, x2.data(), w, in.dout.data(), t.gate.data(), t.up.data(), t.act.data(),
                      {dwg2.data(), dwu2.data(), dwd2.data()}, x2.data(), false, t.tile.data());
  dev.synchronize(s);
  for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(x2[i].bits, dx[i].bits) << i;  // bitwise
  EXPECT_EQ(dwg2, dwg);
  EXPECT_EQ(dwu2, dwu);
  EXPECT_EQ(dwd2, dwd);
}

TEST(SwigluFfnBf16, BuffersTakeThePrecision) {
  const SwigluFfnBuffers b = swiglu_ffn_buffers(37, 5, 22, Precision::bf16);
  EXPECT_EQ(b.gate.bytes, 37u * 22 * 2);
  EXPECT_EQ(b.act.bytes, 37u * 22 * 2);
  EXPECT_EQ(b.tile.bytes, 37u * 22 * 4);  // [min(m, 256), max(H, F)] floats
  EXPECT_EQ(swiglu_ffn_buffers(600, 64, 22, Precision::bf16, Component::dispatch).tile.bytes, 256u * 64 * 4);
  EXPECT_EQ(swiglu_ffn_buffers(600, 64, 22, Precision::bf16, Component::dispatch).tile.component, Component::dispatch);
  EXPECT_EQ(b.reserved(), 3 * arena_reserved(37 * 22 * 2) + arena_reserved(37 * 22 * 4));
  // f32: the f32 layers' specs byte for byte, and no tile.
  const SwigluFfnBuffers f = swiglu_ffn_buffers(37, 5, 22, Precision::f32);
  const SwigluFfnBuffers old = swiglu_ffn_buffers(37, 22, 4);
  EXPECT_EQ(f.gate.bytes, old.gate.bytes);
  EXPECT_EQ(f.tile.bytes, 0u);
  EXPECT_EQ(old.tile.bytes, 0u);
  EXPECT_EQ(f.reserved(), old.reserved());
  EXPECT_EQ(f.reserved(), 3 * arena_reserved(37 * 22 * 4));
  EXPECT_THROW(swiglu_ffn_buffers(3, 0, 22, Precision::bf16), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
