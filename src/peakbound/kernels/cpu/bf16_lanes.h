// f32 -> bf16 rounding of a vector register (internal to kernels/cpu): core/dtype.h's
// to_bf16 (round to nearest even, a NaN quieted with its sign and upper payload kept) in
// every lane, denormals included. Each body carries its own target attribute, so a file
// including this needs no -m flags and calls a body only after checking the CPU has it.
// The results are u32 lanes holding the bf16 bits in their low halves.
#pragma once

#include <immintrin.h>

namespace peakbound::cpu::simd {

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

}  // namespace peakbound::cpu::simd
