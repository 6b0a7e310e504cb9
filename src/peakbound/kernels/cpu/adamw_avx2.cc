// The AVX2 + FMA bodies: 8 floats per vector. Same operation order as the scalar
// reference (adamw.cc), every multiply-add an explicit fma, so the bits agree.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "peakbound/kernels/cpu/adamw_simd.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"

#define PB_AVX2 __attribute__((target("avx2,fma")))

namespace peakbound::cpu::simd {

namespace {

PB_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// bf16 -> f32 is exact: the bf16 bits become the top half of the float.
PB_AVX2 inline __m256 load8(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

PB_AVX2 inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }

PB_AVX2 inline void store8(bf16* p, __m256 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16x8(x)); }

// Non-temporal: p aligned to the store's width (32 bytes f32, 16 bytes bf16).
PB_AVX2 inline void stream8(float* p, __m256 x) { _mm256_stream_ps(p, x); }
PB_AVX2 inline void stream8(bf16* p, __m256 x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16x8(x)); }

enum class ParamStore { plain, stream, none };

// Elements [begin, end) (end - begin a multiple of 8).
template <typename G, typename P, ParamStore kStore>
PB_AVX2 void adamw_vectors(const AdamWStepScalars& s, const AdamWTensors& t, std::int64_t begin, std::int64_t end) {
  const G* grad = static_cast<const G*>(t.grad);
  P* param = static_cast<P*>(t.param);
  const __m256 gs = _mm256_set1_ps(s.grad_scale);
  const __m256 b1 = _mm256_set1_ps(s.beta1), omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.eps), ibc2 = _mm256_set1_ps(s.inv_sqrt_bc2);
  const __m256 nss = _mm256_set1_ps(s.neg_step_size), decay = _mm256_set1_ps(s.decay);
  for (std::int64_t i = begin; i < end; i += 8) {
    const __m256 g = _mm256_mul_ps(load8(grad + i), gs);
    const __m256 m = _mm256_fmadd_ps(omb1, g, _mm256_mul_ps(b1, _mm256_loadu_ps(t.m + i)));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(b2, _mm256_loadu_ps(t.v + i)));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(v), ibc2, eps);
    const __m256 w = _mm256_fmadd_ps(nss, _mm256_div_ps(m, d), _mm256_mul_ps(_mm256_loadu_ps(t.master + i), decay));
    _mm256_storeu_ps(t.m + i, m);
    _mm256_storeu_ps(t.v + i, v);
    _mm256_storeu_ps(t.master + i, w);
    if constexpr (kStore == ParamStore::plain) store8(param + i, w);
    else if constexpr (kStore == ParamStore::stream) stream8(param + i, w);
  }
}

template <typename G, typename P>
PB_AVX2 void adamw_typed(const AdamWStepScalars& s, const AdamWTensors& t, bool stream) {
  const bool write_param = !param_is_master(t);
  // With streaming stores, the elements before the parameter's first line boundary
  // go to the scalar body (which computes the same bits).
  std::int64_t head = stream && write_param ? elements_to_line(t) : -1;
  stream = head >= 0;
  head = std::max<std::int64_t>(head, 0);
  if (head > 0) adamw_scalar(s, t.slice(0, head));
  const std::int64_t vec_end = t.n - (t.n - head) % 8;
  if (!write_param) adamw_vectors<G, P, ParamStore::none>(s, t, head, vec_end);
  else if (stream) adamw_vectors<G, P, ParamStore::stream>(s, t, head, vec_end);
  else adamw_vectors<G, P, ParamStore::plain>(s, t, head, vec_end);
  if (vec_end < t.n) adamw_scalar(s, t.slice(vec_end, t.n - vec_end));
  if (stream) _mm_sfence();  // the streamed stores are visible before the task ends
}

template <typename X>
PB_AVX2 void squares_typed(const X* x, std::int64_t n, double* lanes) {
  // Four accumulators of four doubles: lanes 0-15, element j in lane j % 16.
  __m256d acc[4];
  for (int k = 0; k < 4; ++k) acc[k] = _mm256_loadu_pd(lanes + 4 * k);
  const std::int64_t vec_end = n - n % 16;
  for (std::int64_t j = 0; j < vec_end; j += 16) {
    const __m256 a = load8(x + j), b = load8(x + j + 8);
    const __m256d q[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(b)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))};
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_pd(q[k], q[k], acc[k]);
  }
  for (int k = 0; k < 4; ++k) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  if (vec_end < n) squares_scalar(x + vec_end, dtype_of<X>(), n - vec_end, lanes);
}

}  // namespace

void adamw_avx2(const AdamWStepScalars& s, const AdamWTensors& t, bool stream) {
  const bool gb = t.grad_dtype == DType::bf16, pb = t.param_dtype == DType::bf16;
  if (gb && pb) adamw_typed<bf16, bf16>(s, t, stream);
  else if (gb) adamw_typed<bf16, float>(s, t, stream);
  else if (pb) adamw_typed<float, bf16>(s, t, stream);
  else adamw_typed<float, float>(s, t, stream);
}

void squares_avx2(const void* x, DType dtype, std::int64_t n, double* lanes) {
  if (dtype == DType::bf16) squares_typed(static_cast<const bf16*>(x), n, lanes);
  else squares_typed(static_cast<const float*>(x), n, lanes);
}

}  // namespace peakbound::cpu::simd
