// The per-row sigmoid gate (kernels/cpu/row_gate.h) against a naive double computation:
// forward written and accumulated, backward's dx and dz, and the aliasing it allows
// (dx onto x or dout, dz onto z) giving the same bits. The bf16 forms through the op
// layer (bf16 x, out, dout, dx, dz; fp32 z): bitwise the f32 forms' outputs on the
// widened inputs, rounded once.
#include "peakbound/kernels/cpu/row_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/row_gate.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::rounded;
using test_bf16::widened;

std::vector<float> random_vec(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

TEST(RowGate, ForwardAndBackwardMatchNaiveDouble) {
  std::mt19937 rng(3);
  const std::int64_t m = 13, n = 37;
  const auto x = random_vec(m * n, rng, -2, 2), dout = random_vec(m * n, rng, -2, 2);
  auto z = random_vec(m, rng, -6, 6);
  z[0] = -200.0f;  // e^200 overflows to inf: sigmoid 0, no NaN
  const auto base = random_vec(m * n, rng, -1, 1);
  std::vector<float> out(m * n), acc = base, dx(m * n), dz(m);
  row_gate_forward(out.data(), x.data(), z.data(), m, n, false);
  row_gate_forward(acc.data(), x.data(), z.data(), m, n, true);
  row_gate_backward(dx.data(), dz.data(), dout.data(), x.data(), z.data(), m, n);
  for (std::int64_t r = 0; r < m; ++r) {
    const double s = sig(z[r]);
    double dot = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t i = r * n + j;
      EXPECT_NEAR(out[i], s * x[i], 1e-6 * (1 + std::abs(s * x[i])));
      EXPECT_NEAR(acc[i], base[i] + s * x[i], 1e-6 * (1 + std::abs(base[i] + s * x[i])));
      EXPECT_NEAR(dx[i], s * dout[i], 1e-6 * (1 + std::abs(s * dout[i])));
      dot += double(dout[i]) * x[i];
    }
    const double want = s * (1 - s) * dot;
    EXPECT_NEAR(dz[r], want, 1e-6 * (1 + std::abs(want))) << r;
    EXPECT_FALSE(std::isnan(dz[r]));
  }
  // In place: dx onto x, dz onto z; dx onto dout.
  std::vector<float> xi = x, zi = z, di = dout, dz2(m);
  row_gate_backward(xi.data(), zi.data(), dout.data(), xi.data(), zi.data(), m, n);
  EXPECT_EQ(xi, dx);
  EXPECT_EQ(zi, dz);
  row_gate_backward(di.data(), dz2.data(), di.data(), x.data(), z.data(), m, n);
  EXPECT_EQ(di, dx);
  EXPECT_EQ(dz2, dz);
}

void expect_rounded(const std::vector<bf16>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i].bits, peakbound::to_bf16(want[i]).bits) << what << " element " << i << ": f32 " << want[i];
}

TEST(RowGate, Bf16FormsAreTheRoundedF32Forms) {
  CpuDevice dev(1 << 20);
  Stream& s = dev.compute_stream();
  std::mt19937 rng(5);
  for (const auto& [m, n] : {std::pair<std::int64_t, std::int64_t>{13, 37}, {1, 1}, {1, 300}, {0, 8}, {4, 1024}}) {
    const std::string at = std::to_string(m) + "x" + std::to_string(n);
    const auto mn = static_cast<std::size_t>(m * n), mm = static_cast<std::size_t>(m);
    const std::vector<bf16> x = rounded(random_vec(mn, rng, -2, 2)), dout = rounded(random_vec(mn, rng, -2, 2));
    const std::vector<bf16> base = rounded(random_vec(mn, rng, -1, 1));
    std::vector<float> z = random_vec(mm, rng, -6, 6);  // fp32 in both forms: not rounded
    if (m > 1) z[1] = -200.0f;                           // sigmoid 0, no NaN
    const std::vector<float> xf = widened(x), doutf = widened(dout);
    for (const bool acc : {false, true}) {
      std::vector<bf16> out = base;
      std::vector<float> outf = widened(base);
      ops::row_gate_forward(dev, s, out.data(), x.data(), z.data(), m, n, acc);
      ops::row_gate_forward(dev, s, outf.data(), xf.data(), z.data(), m, n, acc);
      expect_rounded(out, outf, "forward " + at + (acc ? " accumulate" : ""));
    }
    std::vector<bf16> dx(mn), dz(mm);
    std::vector<float> dxf(mn), dzf(mm);
    ops::row_gate_backward(dev, s, dx.data(), dz.data(), dout.data(), x.data(), z.data(), m, n);
    ops::row_gate_backward(dev, s, dxf.data(), dzf.data(), doutf.data(), xf.data(), z.data(), m, n);
    expect_rounded(dx, dxf, "dx " + at);
    expect_rounded(dz, dzf, "dz " + at);
    // dx onto x, then onto dout: the same bits.
    std::vector<bf16> xi = x, di = dout, dz2(mm);
    ops::row_gate_backward(dev, s, xi.data(), dz2.data(), dout.data(), xi.data(), z.data(), m, n);
    expect_rounded(xi, dxf, "dx onto x " + at);
    expect_rounded(dz2, dzf, "dz (dx onto x) " + at);
    ops::row_gate_backward(dev, s, di.data(), dz2.data(), di.data(), x.data(), z.data(), m, n);
    expect_rounded(di, dxf, "dx onto dout " + at);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
