#include "peakbound/kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/vexp.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::bits_of;
using test_bf16::rounded;
using test_bf16::rounded_bits;
using test_bf16::widened;

double naive_swiglu(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

std::vector<float> random_vec(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(SwiGlu, ForwardMatchesNaiveDouble) {
  std::mt19937 rng(21);
  const int n = 4099;
  auto g = random_vec(n, rng, -8.0f, 8.0f), u = random_vec(n, rng, -2.0f, 2.0f);
  std::vector<float> out(n), want(n);
  swiglu_forward(out.data(), g.data(), u.data(), n);
  for (int i = 0; i < n; ++i) want[i] = static_cast<float>(naive_swiglu(g[i], u[i]));
  EXPECT_LT(relative_error(out.data(), want.data(), n), 1e-6);
  // Aliasing the output onto either input gives the same bits.
  std::vector<float> on_gate = g, on_up = u;
  swiglu_forward(on_gate.data(), on_gate.data(), u.data(), n);
  swiglu_forward(on_up.data(), g.data(), on_up.data(), n);
  EXPECT_EQ(on_gate, out);
  EXPECT_EQ(on_up, out);
}

// The sigmoid's exp is vexp's (the same bits on every CPU kind): each output is the
// scalar formula on exp_f32, bit for bit, across the kernel's chunks (n past 512, odd),
// including gates whose e^-g overflows (the sigmoid is then 0).
TEST(SwiGlu, SigmoidIsVexpsExpBitForBit) {
  std::mt19937 rng(25);
  const int n = 1301;
  auto g = random_vec(n, rng, -95.0f, 95.0f), u = random_vec(n, rng, -2.0f, 2.0f);
  auto dout = random_vec(n, rng, -1.0f, 1.0f);
  g[0] = -88.0f;
  g[1] = -87.9f;
  g[2] = -1e30f;
  std::vector<float> out(n), dg(n), du(n);
  swiglu_forward(out.data(), g.data(), u.data(), n);
  swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
  for (int i = 0; i < n; ++i) {
    const float s = -g[i] >= 88.0f ? 0.0f : 1.0f / (1.0f + exp_f32(-g[i]));
    ASSERT_EQ(out[i], g[i] * s * u[i]) << i;
    ASSERT_EQ(dg[i], dout[i] * u[i] * s * (1.0f + g[i] * (1.0f - s))) << i;
    ASSERT_EQ(du[i], dout[i] * g[i] * s) << i;
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(22);
  const int n = 2053;
  auto g = random_vec(n, rng, -6.0f, 6.0f), u = random_vec(n, rng, -2.0f, 2.0f);
  auto dout = random_vec(n, rng, -1.0f, 1.0f);
  std::vector<float> dg(n, 7.0f), du(n, 7.0f), fdg(n), fdu(n);
  swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
  const double h = 1e-5;
  for (int i = 0; i < n; ++i) {
    double gi = g[i], ui = u[i];
    fdg[i] = static_cast<float>(dout[i] * (naive_swiglu(gi + h, ui) - naive_swiglu(gi - h, ui)) / (2 * h));
    fdu[i] = static_cast<float>(dout[i] * (naive_swiglu(gi, ui + h) - naive_swiglu(gi, ui - h)) / (2 * h));
  }
  EXPECT_LT(relative_error(dg.data(), fdg.data(), n), 1e-5);
  EXPECT_LT(relative_error(du.data(), fdu.data(), n), 1e-5);
}

TEST(SwiGlu, BackwardInPlaceOnTheForwardBuffers) {
  std::mt19937 rng(23);
  const int n = 257;
  auto g = random_vec(n, rng, -4.0f, 4.0f), u = random_vec(n, rng, -2.0f, 2.0f);
  auto dout = random_vec(n, rng, -1.0f, 1.0f);
  std::vector<float> dg(n), du(n);
  swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
  swiglu_backward(g.data(), u.data(), dout.data(), g.data(), u.data(), n);
  EXPECT_EQ(g, dg);
  EXPECT_EQ(u, du);
}

TEST(SwiGlu, SaturatedGatesStayFinite) {
  std::vector<float> g = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f}, u(5, 1.5f), out(5), dg(5), du(5);
  std::vector<float> dout(5, 1.0f);
  swiglu_forward(out.data(), g.data(), u.data(), 5);
  swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::isfinite(out[i]) && std::isfinite(dg[i]) && std::isfinite(du[i])) << g[i];
  }
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[4], 200.0f * 1.5f);
  EXPECT_EQ(dg[4], 1.5f);   // silu'(g) -> 1 for large g
  EXPECT_EQ(dg[0], 0.0f);   // and -> 0 for very negative g
}

TEST(SwiGlu, Bf16IsTheF32KernelRoundedOnce) {
  std::mt19937 rng(24);
  for (int n : {0, 1, 17, 4099}) {
    const auto z = static_cast<std::size_t>(n);
    auto g = rounded(random_vec(z, rng, -12.0f, 12.0f)), u = rounded(random_vec(z, rng, -2.0f, 2.0f));
    auto dout = rounded(random_vec(z, rng, -1.0f, 1.0f));
    if (n > 3) {  // saturated gates
      g[0] = peakbound::to_bf16(-200.0f);
      g[1] = peakbound::to_bf16(200.0f);
      g[2] = peakbound::to_bf16(-90.0f);
    }
    std::vector<bf16> out(z), dg(z), du(z);
    swiglu_forward(out.data(), g.data(), u.data(), n);
    swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
    auto fg = widened(g), fu = widened(u), fdout = widened(dout);
    std::vector<float> fout(z), fdg(z), fdu(z);
    swiglu_forward(fout.data(), fg.data(), fu.data(), n);
    swiglu_backward(fdg.data(), fdu.data(), fdout.data(), fg.data(), fu.data(), n);
    EXPECT_EQ(bits_of(out), rounded_bits(fout)) << n;
    EXPECT_EQ(bits_of(dg), rounded_bits(fdg)) << n;
    EXPECT_EQ(bits_of(du), rounded_bits(fdu)) << n;
    // In place on the forward's buffers, as the f32 form: the same bits.
    auto on_gate = g;
    swiglu_forward(on_gate.data(), on_gate.data(), u.data(), n);
    EXPECT_EQ(bits_of(on_gate), bits_of(out)) << n;
    auto ig = g, iu = u;
    swiglu_backward(ig.data(), iu.data(), dout.data(), ig.data(), iu.data(), n);
    EXPECT_EQ(bits_of(ig), bits_of(dg)) << n;
    EXPECT_EQ(bits_of(iu), bits_of(du)) << n;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
