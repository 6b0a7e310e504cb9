// gpt-oss's clamped SwiGLU (kernels/cpu/swiglu.h, swiglu_clamped_*): against transformers'
// own GptOssExperts._apply_gate, forward and autograd backward, on values a third of which lie
// past the clamp limit and three exactly on it (tests/fixtures/hf/gpt_oss_parts, written by
// scripts/hf_reference/make_gptoss_fixture.py); against a naive double formula; aliasing;
// the bf16 forms bitwise to_bf16 of the f32 forms on the widened inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "peakbound/io/safetensors.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/swiglu.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::bits_of;
using test_bf16::rounded;
using test_bf16::rounded_bits;
using test_bf16::widened;

const ClampedSwiglu kGptOss{1.702f, 7.0f};

// Interleaved [T, 2I] (gate even, up odd) -> two [T, I].
void split(const std::vector<float>& gu, std::vector<float>& gate, std::vector<float>& up) {
  gate.resize(gu.size() / 2);
  up.resize(gu.size() / 2);
  for (std::size_t i = 0; i < gate.size(); ++i) {
    gate[i] = gu[2 * i];
    up[i] = gu[2 * i + 1];
  }
}

TEST(SwigluClamped, TransformersGptOssApplyGateForwardAndBackward) {
  const SafeTensorsFile f = SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) +
                                                  "/tests/fixtures/hf/gpt_oss_parts/gpt_oss_parts.safetensors");
  std::vector<float> gate, up, want_dgate, want_dup;
  split(f.read_f32("swiglu.gate_up"), gate, up);
  split(f.read_f32("swiglu.dgate_up"), want_dgate, want_dup);
  const std::vector<float> want = f.read_f32("swiglu.out"), dout = f.read_f32("swiglu.dout");
  const auto n = static_cast<std::int64_t>(gate.size());
  ASSERT_EQ(want.size(), gate.size());
  std::size_t clamped = 0;
  for (std::size_t i = 0; i < gate.size(); ++i) clamped += gate[i] > 7.0f || std::fabs(up[i]) > 7.0f;
  EXPECT_GT(clamped, gate.size() / 5) << "the fixture exercises the clamps";
  std::vector<float> out(gate.size()), dgate(gate.size()), dup(gate.size());
  swiglu_clamped_forward(out.data(), gate.data(), up.data(), n, kGptOss);
  swiglu_clamped_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, kGptOss);
  EXPECT_LT(relative_error(out.data(), want.data(), n), 1e-6);
  EXPECT_LT(relative_error(dgate.data(), want_dgate.data(), n), 1e-6);
  EXPECT_LT(relative_error(dup.data(), want_dup.data(), n), 1e-6);
  // Where a clamp stops the gradient (on the bound too, as torch's clamp does), both are
  // exactly zero.
  std::size_t stopped = 0;
  for (std::size_t i = 0; i < gate.size(); ++i) {
    if (gate[i] >= 7.0f) {
      EXPECT_EQ(dgate[i], 0.0f);
      EXPECT_EQ(want_dgate[i], 0.0f);
      ++stopped;
    }
    if (std::fabs(up[i]) >= 7.0f) {
      EXPECT_EQ(dup[i], 0.0f);
      EXPECT_EQ(want_dup[i], 0.0f);
    }
  }
  EXPECT_GT(stopped, 0u);
  EXPECT_EQ(gate[0], 7.0f);  // the fixture's values on the bounds
  EXPECT_EQ(up[0], -7.0f);
  EXPECT_EQ(up[1], 7.0f);
}

TEST(SwigluClamped, MatchesANaiveDoubleFormulaAndMayRunInPlace) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-12.0f, 12.0f);
  const std::int64_t n = 1001;
  std::vector<float> gate(n), up(n), dout(n);
  for (std::int64_t i = 0; i < n; ++i) {
    gate[i] = d(rng);
    up[i] = d(rng);
    dout[i] = d(rng) / 12.0f;
  }
  std::vector<float> out(n), dg(n), du(n), want(n), want_dg(n), want_du(n);
  const double a = kGptOss.alpha, L = kGptOss.limit;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = std::min<double>(gate[i], L), u = std::clamp<double>(up[i], -L, L);
    const double s = 1.0 / (1.0 + std::exp(-a * g));
    want[i] = static_cast<float>((u + 1.0) * g * s);
    want_dg[i] = static_cast<float>(gate[i] < L ? dout[i] * (u + 1.0) * (s + a * g * s * (1.0 - s)) : 0.0);
    want_du[i] = static_cast<float>(std::fabs(up[i]) < L ? dout[i] * g * s : 0.0);
  }
  swiglu_clamped_forward(out.data(), gate.data(), up.data(), n, kGptOss);
  EXPECT_LT(relative_error(out.data(), want.data(), n), 1e-6);
  std::vector<float> g2 = gate, u2 = up;  // in place: dgate over gate, dup over up
  swiglu_clamped_backward(g2.data(), u2.data(), dout.data(), g2.data(), u2.data(), n, kGptOss);
  swiglu_clamped_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n, kGptOss);
  EXPECT_EQ(bits_of(g2), bits_of(dg));
  EXPECT_EQ(bits_of(u2), bits_of(du));
  EXPECT_LT(relative_error(dg.data(), want_dg.data(), n), 1e-6);
  EXPECT_LT(relative_error(du.data(), want_du.data(), n), 1e-6);
}

TEST(SwigluClamped, Bf16FormsAreTheF32FormsRoundedOnce) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-10.0f, 10.0f);
  const std::int64_t n = 777;
  std::vector<float> g(n), u(n), o(n);
  for (std::int64_t i = 0; i < n; ++i) {
    g[i] = d(rng);
    u[i] = d(rng);
    o[i] = d(rng);
  }
  const std::vector<bf16> g16 = rounded(g), u16 = rounded(u), o16 = rounded(o);
  const std::vector<float> gw = widened(g16), uw = widened(u16), ow = widened(o16);
  std::vector<float> out(n), dg(n), du(n);
  swiglu_clamped_forward(out.data(), gw.data(), uw.data(), n, kGptOss);
  swiglu_clamped_backward(dg.data(), du.data(), ow.data(), gw.data(), uw.data(), n, kGptOss);
  std::vector<bf16> out16(n), dg16(n), du16(n);
  swiglu_clamped_forward(out16.data(), g16.data(), u16.data(), n, kGptOss);
  swiglu_clamped_backward(dg16.data(), du16.data(), o16.data(), g16.data(), u16.data(), n, kGptOss);
  EXPECT_EQ(bits_of(out16), rounded_bits(out));
  EXPECT_EQ(bits_of(dg16), rounded_bits(dg));
  EXPECT_EQ(bits_of(du16), rounded_bits(du));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
