#include "peakbound/kernels/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

namespace peakbound::cpu {

namespace {

// 1 / (1 + e^-g): for g << 0, e^-g overflows to inf and the result is 0, as it should be.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

template <typename T>
void swiglu_forward_t(T* out, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = widen(gate[i]);
    out[i] = narrow<T>(g * sigmoid(g) * widen(up[i]));
  }
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g). Each element's inputs are read
// before its outputs are written (dgate may alias gate, dup up).
template <typename T>
void swiglu_backward_t(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = widen(gate[i]), u = widen(up[i]), d = widen(dout[i]);
    const float s = sigmoid(g);
    dgate[i] = narrow<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = narrow<T>(d * g * s);
  }
}

template <typename T>
void swiglu_clamped_forward_t(T* out, const T* gate, const T* up, std::int64_t n, ClampedSwiglu c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = std::min(widen(gate[i]), c.limit);
    const float u = std::clamp(widen(up[i]), -c.limit, c.limit);
    const float glu = g * sigmoid(g * c.alpha);
    out[i] = narrow<T>((u + 1.0f) * glu);
  }
}

template <typename T>
void swiglu_clamped_backward_t(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n,
                               ClampedSwiglu c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = widen(gate[i]), ui = widen(up[i]), d = widen(dout[i]);
    const float g = std::min(gi, c.limit), u = std::clamp(ui, -c.limit, c.limit);
    const float s = sigmoid(g * c.alpha);
    const float dglu = d * (u + 1.0f);
    dgate[i] = narrow<T>(gi < c.limit ? dglu * s * (1.0f + c.alpha * g * (1.0f - s)) : 0.0f);
    dup[i] = narrow<T>(ui > -c.limit && ui < c.limit ? d * (g * s) : 0.0f);
  }
}

}  // namespace

void swiglu_clamped_forward(float* out, const float* gate, const float* up, std::int64_t n, ClampedSwiglu c) {
  swiglu_clamped_forward_t(out, gate, up, n, c);
}
void swiglu_clamped_forward(bf16* out, const bf16* gate, const bf16* up, std::int64_t n, ClampedSwiglu c) {
  swiglu_clamped_forward_t(out, gate, up, n, c);
}
void swiglu_clamped_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                             std::int64_t n, ClampedSwiglu c) {
  swiglu_clamped_backward_t(dgate, dup, dout, gate, up, n, c);
}
void swiglu_clamped_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                             std::int64_t n, ClampedSwiglu c) {
  swiglu_clamped_backward_t(dgate, dup, dout, gate, up, n, c);
}

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  swiglu_forward_t(out, gate, up, n);
}
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::int64_t n) {
  swiglu_forward_t(out, gate, up, n);
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n) {
  swiglu_backward_t(dgate, dup, dout, gate, up, n);
}
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::int64_t n) {
  swiglu_backward_t(dgate, dup, dout, gate, up, n);
}

}  // namespace peakbound::cpu
