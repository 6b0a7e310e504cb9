// The double-precision pieces every layer test's naive reference is built from, in one
// place (attention_layer_test.cc, moe_layer_reference.h): random inputs rounded to
// float (so the layer under test sees exactly the reference's values), RMSNorm forward
// and backward by the explicit chain rule, and the relative error the tolerances are
// written against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace peakbound::reference {

using Vec = std::vector<double>;

// n values of mean + sd * N(0, 1), each rounded to float.
inline Vec randn(std::int64_t n, std::mt19937& rng, double mean, double sd) {
  std::normal_distribution<double> d(0.0, 1.0);
  Vec v(static_cast<std::size_t>(n));
  for (double& x : v) x = static_cast<float>(mean + sd * d(rng));
  return v;
}

// out[r, :] = x[r, :] * rstd[r] * w, rstd = (mean x^2 + eps)^-1/2, over rows of c.
inline void rms_fwd(const Vec& x, const Vec& w, std::int64_t c, double eps, Vec& out, Vec& rstd) {
  const std::int64_t n = static_cast<std::int64_t>(x.size()) / c;
  out.assign(x.size(), 0);
  rstd.assign(static_cast<std::size_t>(n), 0);
  for (std::int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (std::int64_t j = 0; j < c; ++j) ss += x[r * c + j] * x[r * c + j];
    rstd[r] = 1.0 / std::sqrt(ss / c + eps);
    for (std::int64_t j = 0; j < c; ++j) out[r * c + j] = x[r * c + j] * rstd[r] * w[j];
  }
}

// Backward of rms_fwd for dout: dx += d(out)/dx^T dout, dw += sum_r dout * x * rstd
// (both added: dx must be sized, dw too).
inline void rms_bwd(const Vec& x, const Vec& w, const Vec& rstd, const Vec& dout, std::int64_t c, Vec& dx, Vec& dw) {
  const std::int64_t n = static_cast<std::int64_t>(x.size()) / c;
  for (std::int64_t r = 0; r < n; ++r) {
    double dot = 0;
    for (std::int64_t j = 0; j < c; ++j) dot += dout[r * c + j] * w[j] * x[r * c + j];
    const double s = rstd[r];
    for (std::int64_t j = 0; j < c; ++j) {
      dw[j] += dout[r * c + j] * x[r * c + j] * s;
      dx[r * c + j] += s * dout[r * c + j] * w[j] - x[r * c + j] * s * s * s * dot / c;
    }
  }
}

// max |a - ref| / max |ref| over the tensor (max |a - ref| where ref is all zero).
template <typename T>
double rel_err(const T* a, const Vec& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

}  // namespace peakbound::reference
