// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "peakbound/kernels/cpu/vexp.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "peakbound/kernels/adamw_types.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"

#define PB_AVX2 __attribute__((target("avx2,fma")))
#define PB_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define PB_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,avx2,fma")))

namespace peakbound::cpu {

namespace {

constexpr float kLo = -87.33654475f;  // ln(FLT_MIN): below it the result is 0
constexpr float kHi = 88.0f;          // 2^127 e^r stays finite
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kC1 = 0.693359375f, kC2 = -2.12194440e-4f;  // ln 2 = kC1 + kC2 (Cody-Waite)
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// The scalar body: the AVX2 one's operations one lane at a time (maxps/minps's operand
// order, so a NaN passes through both).
inline float exp_one(float t) {
  float c = kLo > t ? kLo : t;
  c = kHi < c ? kHi : c;
  const float fx = std::floor(std::fma(c, kLog2e, 0.5f));
  float r = std::fma(fx, -kC1, c);
  r = std::fma(fx, -kC2, r);
  const float z = r * r;
  float y = kP[0];
  for (int i = 1; i < 6; ++i) y = std::fma(y, r, kP[i]);
  y = std::fma(y, z, r);
  y = y + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(fx) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  y = y * pow2n;
  return t < kLo ? 0.0f : y;
}

// The same body compiled for FMA: std::fma is then one instruction, where the baseline
// build calls libm's fmaf eight times a value (the flash forward takes one exp a row a
// key tile, and the tails).
PB_AVX2 float exp_one_fma(float t) { return exp_one(t); }

inline float tree(const float* a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

// What element j has subtracted before its exp: one value for every element (per null:
// a row's maximum or log-sum-exp), or per[j] (exp_shifts: each query's log-sum-exp).
struct Shift {
  float one;
  const float* per;
  float at(std::int64_t j) const { return per ? per[j] : one; }
};

// Elements [from, n) one by one into the lanes (lane = j % 8), optionally stored. `low`
// (bf16, or float holding the rounded value: bf16_lanes.h's store_rounded) may be x.
template <typename L>
void tail(float* out, L* low, const float* x, std::int64_t from, std::int64_t n, Shift shift, float* lanes) {
  for (std::int64_t j = from; j < n; ++j) {
    const float e = exp_f32(x[j] - shift.at(j));
    if (out) out[j] = e;
    if (low) simd::store_rounded(low + j, e);
    if (lanes) lanes[j % 8] += e;
  }
}

PB_AVX2 inline __m256 exp8(__m256 t) {
  const __m256 lo = _mm256_set1_ps(kLo);
  __m256 c = _mm256_max_ps(lo, t);
  c = _mm256_min_ps(_mm256_set1_ps(kHi), c);
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(c, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fmadd_ps(fx, _mm256_set1_ps(-kC1), c);
  r = _mm256_fmadd_ps(fx, _mm256_set1_ps(-kC2), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP[i]));
  y = _mm256_fmadd_ps(y, z, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(n));
  return _mm256_andnot_ps(_mm256_cmp_ps(t, lo, _CMP_LT_OQ), y);
}

// The shifts of elements [j, j + 8) and [j, j + 16).
PB_AVX2 inline __m256 shift8(Shift s, std::int64_t j) {
  return s.per ? _mm256_loadu_ps(s.per + j) : _mm256_set1_ps(s.one);
}
PB_AVX512 inline __m512 shift16(Shift s, std::int64_t j) {
  return s.per ? _mm512_loadu_ps(s.per + j) : _mm512_set1_ps(s.one);
}

// One block of 8 at element j: exp(x - shift) into out and, rounded to bf16, low (each
// when set), added into the lanes' running sums. low may be x (read before written).
template <typename L>
PB_AVX2 inline __m256 block8(float* out, L* low, const float* x, Shift shift, std::int64_t j, __m256 acc) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift8(shift, j)));
  if (out) _mm256_storeu_ps(out + j, e);
  if (low) simd::store_rounded8(low + j, e);
  return _mm256_add_ps(acc, e);
}

// Full blocks of 8 from 0 (block8 each); the lanes' sums into `lanes` when set; returns
// where the blocks end.
template <typename L>
PB_AVX2 std::int64_t blocks_avx2(float* out, L* low, const float* x, std::int64_t n, Shift shift,
                                 float* lanes) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) acc = block8(out, low, x, shift, j, acc);
  if (lanes) _mm256_storeu_ps(lanes, acc);
  return j;
}

// exp8's operations on 16 lanes (the power of two applied by VSCALEFPS): lanes 0-7 and
// 8-15 each give exp8's bits.
PB_AVX512 inline __m512 exp16(__m512 t) {
  const __m512 lo = _mm512_set1_ps(kLo);
  __m512 c = _mm512_max_ps(lo, t);
  c = _mm512_min_ps(_mm512_set1_ps(kHi), c);
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(c, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(fx, _mm512_set1_ps(-kC1), c);
  r = _mm512_fmadd_ps(fx, _mm512_set1_ps(-kC2), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP[i]));
  y = _mm512_fmadd_ps(y, z, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  // y * 2^fx in one VSCALEFPS where exp8 builds 2^fx's bits (convert, add the bias,
  // shift) and multiplies: fx is an integer in [-126, 127], so 2^fx is a normal float and
  // both round the same exact product once, and NaN stays NaN.
  y = _mm512_scalef_ps(y, fx);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, lo, _CMP_NLT_UQ), y);
}

// blocks_avx2 sixteen at a time: each half adds into the 8 lanes in element order (the
// low half first), so the lanes hold blocks_avx2's sums; a last block of 8 goes through
// exp8. Returns where the blocks end.
template <typename L>
PB_AVX512 std::int64_t blocks_avx512(float* out, L* low, const float* x, std::int64_t n, Shift shift,
                                   float* lanes) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 32 <= n; j += 32) {  // two blocks in flight (exp16 is a chain of dependent operations)
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift16(shift, j)));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), shift16(shift, j + 16)));
    if (out) _mm512_storeu_ps(out + j, e0);
    if (out) _mm512_storeu_ps(out + j + 16, e1);
    if (low) simd::store_rounded16(low + j, e0);
    if (low) simd::store_rounded16(low + j + 16, e1);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e0));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e0), 1)));
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e1));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e1), 1)));
  }
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift16(shift, j)));
    if (out) _mm512_storeu_ps(out + j, e);
    if (low) simd::store_rounded16(low + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  if (j + 8 <= n) {
    acc = block8(out, low, x, shift, j, acc);
    j += 8;
  }
  if (lanes) _mm256_storeu_ps(lanes, acc);
  return j;
}

// blocks_avx512 with the bf16 copy rounded by VCVTNEPS2BF16 (to_bf16x16's bits), for CPUs
// with AVX512-BF16: the rounding was a third of the operations a block of the flash
// kernel's probabilities took. A copy rather than one template over both: the copy's
// target lets the compiler use AVX512-BF16 and DQ anywhere in it, which a CPU with
// AVX-512 alone must never run.
template <typename L>
PB_AVX512_BF16 std::int64_t blocks_avx512_bf16(float* out, L* low, const float* x, std::int64_t n, Shift shift,
                                             float* lanes) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 32 <= n; j += 32) {  // two blocks in flight, as blocks_avx512
    const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift16(shift, j)));
    const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), shift16(shift, j + 16)));
    if (out) _mm512_storeu_ps(out + j, e0);
    if (out) _mm512_storeu_ps(out + j + 16, e1);
    simd::store_rounded16_native(low + j, e0);
    simd::store_rounded16_native(low + j + 16, e1);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e0));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e0), 1)));
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e1));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e1), 1)));
  }
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift16(shift, j)));
    if (out) _mm512_storeu_ps(out + j, e);
    simd::store_rounded16_native(low + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  if (j + 8 <= n) {
    acc = block8(out, low, x, shift, j, acc);
    j += 8;
  }
  if (lanes) _mm256_storeu_ps(lanes, acc);
  return j;
}

// The largest of x[0, n): sixteen lanes of `x > m ? x : m` (maxps returns its second
// operand when either is NaN, so NaNs are skipped), then the lanes in order.
PB_AVX512 float row_max_avx512(const float* x, std::int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
  float lanes[16];
  _mm512_storeu_ps(lanes, m);
  float out = lanes[0];
  for (int l = 1; l < 16; ++l) out = lanes[l] > out ? lanes[l] : out;
  for (; j < n; ++j) out = x[j] > out ? x[j] : out;
  return out;
}

PB_AVX2 float row_max_avx2(const float* x, std::int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + j), m);  // x > m ? x : m
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float out = lanes[0];
  for (int l = 1; l < 8; ++l) out = lanes[l] > out ? lanes[l] : out;
  for (; j < n; ++j) out = x[j] > out ? x[j] : out;
  return out;
}

// The widest body this CPU runs (kernels/adamw_types.h's levels: avx2 is AVX2 + FMA),
// asked once.
SimdLevel level() {
  static const SimdLevel l = best_simd_level();
  return l;
}

// The one loop behind the entry points.
template <typename L>
float run(float* out, L* low, const float* x, std::int64_t n, Shift shift, bool want_sum) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  if (level() == SimdLevel::avx512 && low != nullptr && simd::cpu_has_avx512_bf16()) {
    j = blocks_avx512_bf16(out, low, x, n, shift, want_sum ? lanes : nullptr);
  } else if (level() == SimdLevel::avx512) {
    j = blocks_avx512(out, low, x, n, shift, want_sum ? lanes : nullptr);
  } else if (level() == SimdLevel::avx2) {
    // The vector lanes start at zero and add in element order: the scalar lanes' sums.
    j = blocks_avx2(out, low, x, n, shift, want_sum ? lanes : nullptr);
  } else {
    j = n / 8 * 8;
    tail(out, low, x, 0, j, shift, want_sum ? lanes : nullptr);
  }
  tail(out, low, x, j, n, shift, want_sum ? lanes : nullptr);
  return want_sum ? tree(lanes) : 0.0f;
}

}  // namespace

float exp_f32(float t) { return level() != SimdLevel::scalar ? exp_one_fma(t) : exp_one(t); }

void exp_shift(float* x, std::int64_t n, float shift) { run<bf16>(x, nullptr, x, n, {shift, nullptr}, false); }

void exp_shift(float* x, bf16* low, std::int64_t n, float shift) { run(x, low, x, n, {shift, nullptr}, false); }

void exp_shift(float* x, float* low, std::int64_t n, float shift) { run(x, low, x, n, {shift, nullptr}, false); }

float exp_shift_sum(float* x, std::int64_t n, float shift) {
  return run<bf16>(x, nullptr, x, n, {shift, nullptr}, true);
}

float exp_shift_sum(bf16* low, const float* x, std::int64_t n, float shift) {
  return run(nullptr, low, x, n, {shift, nullptr}, true);
}

float exp_shift_sum(float* low, const float* x, std::int64_t n, float shift) {
  return run(nullptr, low, x, n, {shift, nullptr}, true);
}

float sum_exp_shift(const float* x, std::int64_t n, float shift) {
  return run<bf16>(nullptr, nullptr, x, n, {shift, nullptr}, true);
}

void exp_shifts(float* x, bf16* low, std::int64_t n, const float* shift) { run(x, low, x, n, {0.0f, shift}, false); }

float row_max(const float* x, std::int64_t n) {
  if (level() == SimdLevel::avx512) return row_max_avx512(x, n);
  if (level() != SimdLevel::scalar) return row_max_avx2(x, n);
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

}  // namespace peakbound::cpu
