// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "peakbound/kernels/cpu/swiglu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "peakbound/kernels/adamw_types.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"
#include "peakbound/kernels/cpu/vexp.h"

#define PB_AVX512 __attribute__((target("avx512f")))

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

// Whether the AVX-512 bodies below run here, asked once.
bool avx512() {
  static const bool yes = best_simd_level() == SimdLevel::avx512;
  return yes;
}

using simd::load16;
using simd::store16;
using simd::unfused;

// -(scale * x) and 1 / (1 + e) (0 where t >= kExpCap), sixteen lanes at a time: the scalar
// loops' operations (a negation flips the sign bit; a NaN t compares false), so their bits.
template <typename T>
PB_AVX512 std::int64_t negated_scaled_avx512(float* t, float* s, const T* x, std::int64_t n, float scale) {
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(vs, load16(x + j))), sign));
    _mm512_storeu_ps(t + j, v);
    _mm512_storeu_ps(s + j, v);
  }
  return j;
}
PB_AVX512 std::int64_t sigmoid_of_exp_avx512(float* s, const float* t, std::int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), cap = _mm512_set1_ps(kExpCap);
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, _mm512_loadu_ps(s + j)));
    const __mmask16 capped = _mm512_cmp_ps_mask(_mm512_loadu_ps(t + j), cap, _CMP_GE_OQ);
    _mm512_storeu_ps(s + j, _mm512_maskz_mov_ps(static_cast<__mmask16>(~capped), r));
  }
  return j;
}

// s[j] = sigmoid(scale * x[j]) = 1 / (1 + e^-(scale x[j])) for j < n (n <= kChunk).
template <typename T>
void sigmoid_chunk(float* s, const T* x, std::int64_t n, float scale) {
  float t[kChunk];
  const std::int64_t v = avx512() ? negated_scaled_avx512(t, s, x, n, scale) : 0;
  for (std::int64_t j = v; j < n; ++j) t[j] = -(scale * widen(x[j]));
  for (std::int64_t j = v; j < n; ++j) s[j] = t[j];
  exp_shift(s, n, 0.0f);
  const std::int64_t w = avx512() ? sigmoid_of_exp_avx512(s, t, n) : 0;
  for (std::int64_t j = w; j < n; ++j) s[j] = t[j] >= kExpCap ? 0.0f : 1.0f / (1.0f + s[j]);
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

// The plain SwiGLU's element formulas sixteen at a time over a chunk's sigmoids s (the
// scalar bodies' products in their order, no FMA), returning where they stop; the scalar
// bodies take the rest.
template <typename T>
PB_AVX512 std::int64_t forward_avx512(T* out, const T* gate, const T* up, const float* s, std::int64_t m) {
  std::int64_t j = 0;
  for (; j + 16 <= m; j += 16)
    store16(out + j, _mm512_mul_ps(_mm512_mul_ps(load16(gate + j), _mm512_loadu_ps(s + j)), load16(up + j)));
  return j;
}
template <typename T>
PB_AVX512 std::int64_t backward_avx512(T* dgate, T* dup, const T* dout, const T* gate, const T* up, const float* s,
                                       std::int64_t m) {
  const __m512 one = _mm512_set1_ps(1.0f);
  std::int64_t j = 0;
  for (; j + 16 <= m; j += 16) {
    const __m512 g = load16(gate + j), u = load16(up + j), d = load16(dout + j), sv = _mm512_loadu_ps(s + j);
    const __m512 slope = _mm512_add_ps(one, unfused(_mm512_mul_ps(g, _mm512_sub_ps(one, sv))));
    store16(dgate + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(d, u), sv), slope));
    store16(dup + j, _mm512_mul_ps(_mm512_mul_ps(d, g), sv));
  }
  return j;
}

template <typename T>
void swiglu_forward_t(T* out, const T* gate, const T* up, std::int64_t n) {
  float s[kChunk];
  for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const std::int64_t m = std::min(kChunk, n - i0);
    sigmoid_chunk(s, gate + i0, m, 1.0f);
    const std::int64_t v = avx512() ? forward_avx512(out + i0, gate + i0, up + i0, s, m) : 0;
    for (std::int64_t j = v; j < m; ++j) {
      const std::int64_t i = i0 + j;
      out[i] = narrow<T>(widen(gate[i]) * s[j] * widen(up[i]));
    }
  }
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g). Each element's inputs are read
// before its outputs are written (dgate may alias gate, dup up).
template <typename T>
void swiglu_backward_t(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  float s[kChunk];
  for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const std::int64_t m = std::min(kChunk, n - i0);
    sigmoid_chunk(s, gate + i0, m, 1.0f);
    const std::int64_t v = avx512() ? backward_avx512(dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, s, m) : 0;
    for (std::int64_t j = v; j < m; ++j) {
      const std::int64_t i = i0 + j;
      const float g = widen(gate[i]), u = widen(up[i]), d = widen(dout[i]), sj = s[j];
      dgate[i] = narrow<T>(d * u * sj * (1.0f + g * (1.0f - sj)));
      dup[i] = narrow<T>(d * g * sj);
    }
  }
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
