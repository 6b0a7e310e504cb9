// f32 -> bf16 rounding of a vector register (internal to kernels/cpu): core/dtype.h's
// to_bf16 (round to nearest even, a NaN quieted with its sign and upper payload kept) in
// every lane, denormals included. Each body carries its own target attribute, so a file
// including this needs no -m flags and calls a body only after checking the CPU has it.
//
// The arithmetic, lane by lane: u + 0x7fff + (bit 16 of u), keep the top half; a NaN lane
// (|u| > 0x7f800000) takes its own top half with the quiet bit set instead. Adding the bias
// cannot wrap for a non-NaN u (at most 0xff800000 + 0x8000), and rounds a finite value past
// the largest bf16 to inf.
#pragma once

#include <immintrin.h>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu::simd {

// u32 lanes holding the bf16 bits in their low halves.
__attribute__((target("avx2"))) inline __m256i to_bf16_lanes8(__m256i u) {
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  // Signed compare is right here: both sides are below 2^31.
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

__attribute__((target("avx512f"))) inline __m512i to_bf16_lanes16(__m512i u) {
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                   _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet);
}

// 8 or 16 floats as packed bf16 (element i at u16 i), ready to store.
__attribute__((target("avx2"))) inline __m128i to_bf16x8(__m256 x) {
  const __m256i r = to_bf16_lanes8(_mm256_castps_si256(x));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx512f"))) inline __m256i to_bf16x16(__m512 x) {
  return _mm512_cvtepi32_epi16(to_bf16_lanes16(_mm512_castps_si512(x)));
}

// to_bf16x16's bits through AVX512-BF16's VCVTNEPS2BF16, one instruction for to_bf16x16's
// ten: it rounds to nearest even and quiets a NaN (its top half, quiet bit set) as
// to_bf16 does, but reads a denormal input as zero, so a vector holding one (none among
// exp's results, which flush below FLT_MIN; rare in a gradient) takes the integer path.
// Callers run it only where the CPU has AVX512-BF16 (cpu_has_avx512_bf16()).
__attribute__((target("avx512f,avx512dq,avx512bf16"))) inline __m256i to_bf16x16_native(__m512 x) {
  if (_mm512_fpclass_ps_mask(x, 0x20) != 0) return to_bf16x16(x);  // 0x20: denormal
  return (__m256i)_mm512_cvtneps_pbh(x);
}

// Whether to_bf16x16_native may run here (AVX512-BF16 and AVX512DQ, which every CPU with
// AVX512-BF16 has), asked once; also what the native bf16 GEMM path needs.
inline bool cpu_has_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
  return yes;
}

// Stores of x rounded to bf16 at p: packed (bf16*), or as the rounded values held in
// fp32 (float*: the bits the packed ones widen to, for a convert-path GEMM operand that
// then needs no widening pass). The _native forms round by to_bf16x16_native.
inline void store_rounded(bf16* p, float x) { *p = narrow<bf16>(x); }
inline void store_rounded(float* p, float x) { *p = widen(narrow<bf16>(x)); }
__attribute__((target("avx2"))) inline void store_rounded8(bf16* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16x8(x));
}
__attribute__((target("avx2"))) inline void store_rounded8(float* p, __m256 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_slli_epi32(to_bf16_lanes8(_mm256_castps_si256(x)), 16));
}
__attribute__((target("avx512f"))) inline void store_rounded16(bf16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16x16(x));
}
__attribute__((target("avx512f"))) inline void store_rounded16(float* p, __m512 x) {
  _mm512_storeu_si512(p, _mm512_slli_epi32(to_bf16_lanes16(_mm512_castps_si512(x)), 16));
}
__attribute__((target("avx512f,avx512dq,avx512bf16"))) inline void store_rounded16_native(bf16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16x16_native(x));
}
__attribute__((target("avx512f,avx512dq,avx512bf16"))) inline void store_rounded16_native(float* p, __m512 x) {
  _mm512_storeu_si512(p, _mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16x16_native(x)), 16));
}

// Sixteen elements of T as fp32 (a bf16 widened exactly), and sixteen fp32 stored back as T
// (bf16 rounded as narrow<bf16>): the element kernels' AVX-512 bodies (swiglu.cc, rmsnorm.cc).
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 load16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
__attribute__((target("avx512f"))) inline void store16(bf16* p, __m512 v) { store_rounded16(p, v); }

// The value of v, opaque to the optimiser: a product passed through it is rounded before the
// add that follows. GCC contracts an intrinsic multiply and a following add into one FMA in
// a function whose target has FMA (its default -ffp-contract=fast), where the scalar loops,
// compiled for baseline x86-64, round the product first: a vector body meant to give their
// bits keeps each such product apart with this.
__attribute__((target("avx512f"))) inline __m512 unfused(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}
__attribute__((target("avx512f"))) inline __m512d unfused(__m512d v) {
  __asm__("" : "+v"(v));
  return v;
}

}  // namespace peakbound::cpu::simd
