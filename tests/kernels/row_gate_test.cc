// The per-row sigmoid gate (kernels/cpu/row_gate.h) against a naive double computation:
// forward written and accumulated, backward's dx and dz, and the aliasing it allows
// (dx onto x or dout, dz onto z) giving the same bits.
#include "peakbound/kernels/cpu/row_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace peakbound::cpu {
namespace {

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

}  // namespace
}  // namespace peakbound::cpu
