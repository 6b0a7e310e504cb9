// The AVX-512 bodies: 16 floats per vector. Same operation order as the scalar
// reference (adamw.cc), every multiply-add an explicit fma, so the bits agree.
// Selected only where the CPU reports avx512f and avx512bw.
//
// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "peakbound/kernels/cpu/adamw_simd.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"

#define PB_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace peakbound::cpu::simd {

namespace {

// load16 and store16 (fp32 or bf16 as fp32, bf16 rounded as narrow<bf16>): bf16_lanes.h.

// Non-temporal: p aligned to the store's width (64 bytes f32, 32 bytes bf16).
PB_AVX512 inline void stream16(float* p, __m512 x) { _mm512_stream_ps(p, x); }
PB_AVX512 inline void stream16(bf16* p, __m512 x) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16x16(x));
}

enum class ParamStore { plain, stream, none };

// Elements [begin, end) (end - begin a multiple of 16).
template <typename G, typename P, ParamStore kStore>
PB_AVX512 void adamw_vectors(const AdamWStepScalars& s, const AdamWTensors& t, std::int64_t begin, std::int64_t end) {
  const G* grad = static_cast<const G*>(t.grad);
  P* param = static_cast<P*>(t.param);
  const __m512 gs = _mm512_set1_ps(s.grad_scale);
  const __m512 b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(s.eps), ibc2 = _mm512_set1_ps(s.inv_sqrt_bc2);
  const __m512 nss = _mm512_set1_ps(s.neg_step_size), decay = _mm512_set1_ps(s.decay);
  for (std::int64_t i = begin; i < end; i += 16) {
    const __m512 g = _mm512_mul_ps(load16(grad + i), gs);
    const __m512 m = _mm512_fmadd_ps(omb1, g, _mm512_mul_ps(b1, _mm512_loadu_ps(t.m + i)));
    const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(omb2, g), g, _mm512_mul_ps(b2, _mm512_loadu_ps(t.v + i)));
    const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), ibc2, eps);
    const __m512 w = _mm512_fmadd_ps(nss, _mm512_div_ps(m, d), _mm512_mul_ps(_mm512_loadu_ps(t.master + i), decay));
    _mm512_storeu_ps(t.m + i, m);
    _mm512_storeu_ps(t.v + i, v);
    _mm512_storeu_ps(t.master + i, w);
    if constexpr (kStore == ParamStore::plain) store16(param + i, w);
    else if constexpr (kStore == ParamStore::stream) stream16(param + i, w);
  }
}

template <typename G, typename P>
PB_AVX512 void adamw_typed(const AdamWStepScalars& s, const AdamWTensors& t, bool stream) {
  const bool write_param = !param_is_master(t);
  // With streaming stores, the elements before the parameter's first line boundary
  // go to the scalar body (which computes the same bits).
  std::int64_t head = stream && write_param ? elements_to_line(t) : -1;
  stream = head >= 0;
  head = std::max<std::int64_t>(head, 0);
  if (head > 0) adamw_scalar(s, t.slice(0, head));
  const std::int64_t vec_end = t.n - (t.n - head) % 16;
  if (!write_param) adamw_vectors<G, P, ParamStore::none>(s, t, head, vec_end);
  else if (stream) adamw_vectors<G, P, ParamStore::stream>(s, t, head, vec_end);
  else adamw_vectors<G, P, ParamStore::plain>(s, t, head, vec_end);
  if (vec_end < t.n) adamw_scalar(s, t.slice(vec_end, t.n - vec_end));
  if (stream) _mm_sfence();  // the streamed stores are visible before the task ends
}

template <typename X>
PB_AVX512 void squares_typed(const X* x, std::int64_t n, double* lanes) {
  // Two accumulators of eight doubles: lanes 0-15, element j in lane j % 16.
  __m512d lo = _mm512_loadu_pd(lanes), hi = _mm512_loadu_pd(lanes + 8);
  const std::int64_t vec_end = n - n % 16;
  for (std::int64_t j = 0; j < vec_end; j += 16) {
    const __m512 a = load16(x + j);
    const __m512d qa = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
    const __m512d qb = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    lo = _mm512_fmadd_pd(qa, qa, lo);
    hi = _mm512_fmadd_pd(qb, qb, hi);
  }
  _mm512_storeu_pd(lanes, lo);
  _mm512_storeu_pd(lanes + 8, hi);
  if (vec_end < n) squares_scalar(x + vec_end, dtype_of<X>(), n - vec_end, lanes);
}

}  // namespace

void adamw_avx512(const AdamWStepScalars& s, const AdamWTensors& t, bool stream) {
  const bool gb = t.grad_dtype == DType::bf16, pb = t.param_dtype == DType::bf16;
  if (gb && pb) adamw_typed<bf16, bf16>(s, t, stream);
  else if (gb) adamw_typed<bf16, float>(s, t, stream);
  else if (pb) adamw_typed<float, bf16>(s, t, stream);
  else adamw_typed<float, float>(s, t, stream);
}

void squares_avx512(const void* x, DType dtype, std::int64_t n, double* lanes) {
  if (dtype == DType::bf16) squares_typed(static_cast<const bf16*>(x), n, lanes);
  else squares_typed(static_cast<const float*>(x), n, lanes);
}

}  // namespace peakbound::cpu::simd
