#include "peakbound/kernels/cpu/elementwise.h"

#include <cmath>
#include <limits>

namespace peakbound::cpu {

void fill(float* x, std::int64_t n, float v) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = v;
}

void scale(float* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= a;
}

void axpy(float* y, const float* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void add(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void to_bf16(bf16* out, const float* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = peakbound::to_bf16(in[i]);
}

void to_f32(float* out, const bf16* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = peakbound::to_f32(in[i]);
}

double max_abs(const float* x, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double v = std::fabs(static_cast<double>(x[i]));
    if (std::isnan(v)) return std::numeric_limits<double>::quiet_NaN();
    if (v > m) m = v;
  }
  return m;
}

double max_abs_diff(const float* a, const float* b, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    if (d > m) m = d;
  }
  return m;
}

double relative_error(const float* a, const float* ref, std::int64_t n) {
  double diff = max_abs_diff(a, ref, n);
  double scale = max_abs(ref, n);
  if (std::isnan(diff) || std::isnan(scale)) return std::numeric_limits<double>::quiet_NaN();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace peakbound::cpu
