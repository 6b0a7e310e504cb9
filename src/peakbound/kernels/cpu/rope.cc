#include "peakbound/kernels/cpu/rope.h"

#include <cmath>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound::cpu {

void rope_check(std::int64_t t, std::int64_t d, std::int64_t offset, double theta) {
  if (t < 0) throw InvalidArgument("rope: sequence length must be >= 0, got " + std::to_string(t));
  if (d <= 0 || d % 2 != 0)
    throw InvalidArgument("rope: head dim must be even and > 0 (rotate_half splits it in halves), got " +
                          std::to_string(d));
  if (offset < 0) throw InvalidArgument("rope: position offset must be >= 0, got " + std::to_string(offset));
  if (!(theta > 0.0 && std::isfinite(theta)))
    throw InvalidArgument("rope: rope_theta must be finite and > 0, got " + std::to_string(theta));
}

void rope_tables(float* cos, float* sin, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta, const RopeScaling& scaling) {
  rope_check(t, d, offset, theta);
  const std::int64_t half = d / 2;
  const double a = rope_table_factor(scaling);
  for (std::int64_t i = 0; i < half; ++i) {
    const double inv_freq = rope_inv_freq(theta, scaling, i, d);
    for (std::int64_t p = 0; p < t; ++p) {
      const double angle = static_cast<double>(offset + p) * inv_freq;
      cos[p * half + i] = static_cast<float>(std::cos(angle) * a);
      sin[p * half + i] = static_cast<float>(std::sin(angle) * a);
    }
  }
}

namespace {

// sign = +1 rotates by +angle, -1 by -angle. T is the storage of x (float or bf16):
// loads widened, stores narrowed once.
template <typename T>
void rotate(T* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
            std::int64_t d, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t p = 0; p < t; ++p) {
    const float* c = cos + p * half;
    const float* s = sin + p * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      T* x1 = x + (p * heads + h) * d;
      T* x2 = x1 + half;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = widen(x1[i]), b = widen(x2[i]), si = sign * s[i];
        x1[i] = narrow<T>(a * c[i] - b * si);
        x2[i] = narrow<T>(b * c[i] + a * si);
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                  std::int64_t d) {
  rotate(x, cos, sin, t, heads, d, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, std::int64_t t,
                   std::int64_t heads, std::int64_t d) {
  rotate(dx, cos, sin, t, heads, d, -1.0f);
}

void rope_forward(bf16* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                  std::int64_t d) {
  rotate(x, cos, sin, t, heads, d, 1.0f);
}

void rope_backward(bf16* dx, const float* cos, const float* sin, std::int64_t t,
                   std::int64_t heads, std::int64_t d) {
  rotate(dx, cos, sin, t, heads, d, -1.0f);
}

}  // namespace peakbound::cpu
