#include "peakbound/kernels/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "peakbound/kernels/cpu/vexp.h"

namespace peakbound::cpu {

namespace {

// Elements go through in chunks: the chunk's sigmoids first, with vexp's vector exp (the
// same bits on every CPU kind, where a libm call an element cost about as much as the
// FFN's GEMMs on AMX), then the element formulas, which read an element's inputs before
// they write its outputs (so the aliasing the header allows stays safe).
constexpr std::int64_t kChunk = 512;
// exp_shift takes an exponent above this as this (vexp.h): 1 / (1 + e^88) is below
// FLT_MIN, so such a sigmoid is 0, as 1 / (1 + inf) was with libm's overflowing exp.
constexpr float kExpCap = 88.0f;

// s[j] = sigmoid(scale * x[j]) = 1 / (1 + e^-(scale x[j])) for j < n (n <= kChunk).
template <typename T>
void sigmoid_chunk(float* s, const T* x, std::int64_t n, float scale) {
  float t[kChunk];
  for (std::int64_t j = 0; j < n; ++j) t[j] = -(scale * widen(x[j]));
  for (std::int64_t j = 0; j < n; ++j) s[j] = t[j];
  exp_shift(s, n, 0.0f);
  for (std::int64_t j = 0; j < n; ++j) s[j] = t[j] >= kExpCap ? 0.0f : 1.0f / (1.0f + s[j]);
}

// The gpt-oss form's gate: min(gate, limit), so its sigmoid is of alpha * that.
template <typename T>
void clamped_sigmoid_chunk(float* s, const T* gate, std::int64_t n, ClampedSwiglu c) {
  float g[kChunk];
  for (std::int64_t j = 0; j < n; ++j) g[j] = std::min(widen(gate[j]), c.limit);
  sigmoid_chunk(s, g, n, c.alpha);
}

// body(i, s) for every element i, s its gate's sigmoid (scale * gate, the gate clamped to
// `limit` first where `clamped`), a chunk's sigmoids at a time.
template <typename T, class Body>
void by_chunks(const T* gate, std::int64_t n, bool clamped, ClampedSwiglu c, const Body& body) {
  float s[kChunk];
  for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const std::int64_t m = std::min(kChunk, n - i0);
    if (clamped) clamped_sigmoid_chunk(s, gate + i0, m, c);
    else sigmoid_chunk(s, gate + i0, m, 1.0f);
    for (std::int64_t j = 0; j < m; ++j) body(i0 + j, s[j]);
  }
}

template <typename T>
void swiglu_forward_t(T* out, const T* gate, const T* up, std::int64_t n) {
  by_chunks(gate, n, false, {}, [&](std::int64_t i, float s) {
    const float g = widen(gate[i]);
    out[i] = narrow<T>(g * s * widen(up[i]));
  });
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g). Each element's inputs are read
// before its outputs are written (dgate may alias gate, dup up).
template <typename T>
void swiglu_backward_t(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  by_chunks(gate, n, false, {}, [&](std::int64_t i, float s) {
    const float g = widen(gate[i]), u = widen(up[i]), d = widen(dout[i]);
    dgate[i] = narrow<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = narrow<T>(d * g * s);
  });
}

template <typename T>
void swiglu_clamped_forward_t(T* out, const T* gate, const T* up, std::int64_t n, ClampedSwiglu c) {
  by_chunks(gate, n, true, c, [&](std::int64_t i, float s) {
    const float g = std::min(widen(gate[i]), c.limit);
    const float u = std::clamp(widen(up[i]), -c.limit, c.limit);
    const float glu = g * s;
    out[i] = narrow<T>((u + 1.0f) * glu);
  });
}

template <typename T>
void swiglu_clamped_backward_t(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n,
                               ClampedSwiglu c) {
  by_chunks(gate, n, true, c, [&](std::int64_t i, float s) {
    const float gi = widen(gate[i]), ui = widen(up[i]), d = widen(dout[i]);
    const float g = std::min(gi, c.limit), u = std::clamp(ui, -c.limit, c.limit);
    const float dglu = d * (u + 1.0f);
    dgate[i] = narrow<T>(gi < c.limit ? dglu * s * (1.0f + c.alpha * g * (1.0f - s)) : 0.0f);
    dup[i] = narrow<T>(ui > -c.limit && ui < c.limit ? d * (g * s) : 0.0f);
  });
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
