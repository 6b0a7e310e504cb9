#include "peakbound/kernels/cpu/swiglu.h"

#include <cmath>

namespace peakbound::cpu {

namespace {

// 1 / (1 + e^-g): for g << 0, e^-g overflows to inf and the result is 0, as it should be.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float s = sigmoid(g);
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
}

}  // namespace peakbound::cpu
