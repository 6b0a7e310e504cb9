// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "peakbound/kernels/cpu/rmsnorm.h"

#include <immintrin.h>

#include <cmath>

#include "peakbound/kernels/adamw_types.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"

#define PB_AVX512 __attribute__((target("avx512f")))

namespace peakbound::cpu {

namespace {

// Row reductions accumulate in double over 8 lanes (element j into lane j % 8, in order;
// then the fixed tree ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))): C can be 8K wide, and
// independent lanes let the compiler vectorise the sum where one running sum was a chain
// of dependent adds (the forward took 2% of a 4-rank step). The order is the same at any
// vector width, so every CPU kind gives the same bits. Written once over the storage
// type T of x, weight, out, dout, dx (core/dtype.h); rstd and dweight are fp32 for both.
constexpr int kLanes = 8;

// The sum of term(j) (a double) over j in [0, c), in the lane order above: the whole blocks
// of 8 from 0 by `blocks` (which fills the lanes and returns where it stopped), the rest
// one by one. Without `blocks`, the blocks are term's, lane by lane.
template <typename F, typename B>
double lane_sum(std::int64_t c, F term, B blocks) {
  double lanes[kLanes] = {};
  std::int64_t j = blocks(lanes);
  for (; j < c; ++j) lanes[j % kLanes] += term(j);
  const double* a = lanes;
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}
template <typename F>
double lane_sum(std::int64_t c, F term) {
  return lane_sum(c, term, [&](double* lanes) {
    std::int64_t j = 0;
    for (; j + kLanes <= c; j += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
    return j;
  });
}

// The AVX-512 bodies, where the CPU has them: the scalar loops' operations in their order,
// the eight double lanes one vector (element j in lane j % 8), a product kept out of the
// add that follows it (the scalar code, compiled without FMA, rounds it first), bf16
// rounded as narrow<bf16>. Each returns where it stopped; the scalar loops take the rest.
bool avx512() {
  static const bool yes = best_simd_level() == SimdLevel::avx512;
  return yes;
}

// Eight elements of T as fp32 (a bf16 widened exactly).
PB_AVX512 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
PB_AVX512 inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

using simd::load16;
using simd::store16;
using simd::unfused;

// lanes[l] += x_j * x_j (in double) for the whole blocks of 8 from 0.
template <typename T>
PB_AVX512 std::int64_t squares_avx512(const T* x, std::int64_t c, double* lanes) {
  __m512d acc = _mm512_setzero_pd();
  std::int64_t j = 0;
  for (; j + 8 <= c; j += 8) {
    const __m512d v = _mm512_cvtps_pd(load8(x + j));
    acc = _mm512_add_pd(acc, unfused(_mm512_mul_pd(v, v)));
  }
  _mm512_storeu_pd(lanes, acc);
  return j;
}

// lanes[l] += (w_j g_j) (x_j r) (in double, x_j r an fp32 product) for the whole blocks of 8.
template <typename T>
PB_AVX512 std::int64_t weighted_dot_avx512(const T* w, const T* g, const T* x, float r, std::int64_t c,
                                           double* lanes) {
  __m512d acc = _mm512_setzero_pd();
  const __m256 vr = _mm256_set1_ps(r);
  std::int64_t j = 0;
  for (; j + 8 <= c; j += 8) {
    const __m512d wg = _mm512_mul_pd(_mm512_cvtps_pd(load8(w + j)), _mm512_cvtps_pd(load8(g + j)));
    const __m512d xr = _mm512_cvtps_pd(_mm256_mul_ps(load8(x + j), vr));
    acc = _mm512_add_pd(acc, unfused(_mm512_mul_pd(wg, xr)));
  }
  _mm512_storeu_pd(lanes, acc);
  return j;
}

// out_j = (x_j r) w_j.
template <typename T>
PB_AVX512 std::int64_t scaled_avx512(T* out, const T* x, const T* w, float r, std::int64_t c) {
  const __m512 vr = _mm512_set1_ps(r);
  std::int64_t j = 0;
  for (; j + 16 <= c; j += 16) store16(out + j, _mm512_mul_ps(_mm512_mul_ps(load16(x + j), vr), load16(w + j)));
  return j;
}

// dx_j = dx_j + r (w_j g_j - xhat_j mean), dweight_j += g_j xhat_j, xhat_j = x_j r.
template <typename T>
PB_AVX512 std::int64_t backward_row_avx512(T* dx, float* dweight, const T* g, const T* x, const T* w, float r,
                                           float mean, std::int64_t c) {
  const __m512 vr = _mm512_set1_ps(r), vm = _mm512_set1_ps(mean);
  std::int64_t j = 0;
  for (; j + 16 <= c; j += 16) {
    const __m512 xhat = _mm512_mul_ps(load16(x + j), vr), gv = load16(g + j);
    const __m512 diff = _mm512_sub_ps(unfused(_mm512_mul_ps(load16(w + j), gv)), unfused(_mm512_mul_ps(xhat, vm)));
    store16(dx + j, _mm512_add_ps(load16(dx + j), unfused(_mm512_mul_ps(vr, diff))));
    _mm512_storeu_ps(dweight + j, _mm512_add_ps(_mm512_loadu_ps(dweight + j), unfused(_mm512_mul_ps(gv, xhat))));
  }
  return j;
}

template <typename T>
void rmsnorm_forward_t(T* out, float* rstd, const T* x, const T* weight, std::int64_t n, std::int64_t c, float eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    T* oi = out + i * c;  // may be xi: each element is read before it is written
    const auto square = [xi](std::int64_t j) {
      const double v = widen(xi[j]);
      return v * v;
    };
    const double ss = avx512() ? lane_sum(c, square, [&](double* lanes) { return squares_avx512(xi, c, lanes); })
                               : lane_sum(c, square);
    float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
    const std::int64_t v = avx512() ? scaled_avx512(oi, xi, weight, r, c) : 0;
    for (std::int64_t j = v; j < c; ++j) oi[j] = narrow<T>(widen(xi[j]) * r * widen(weight[j]));
    if (rstd) rstd[i] = r;
  }
}

// With xhat = x * r: dx_j = r * (w_j dout_j - xhat_j * mean_k(w_k dout_k xhat_k)),
// dweight_j = sum_n dout_j xhat_j.
template <typename T>
void rmsnorm_backward_t(T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd,
                        std::int64_t n, std::int64_t c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    const T* gi = dout + i * c;
    T* dxi = dx + i * c;
    const float r = rstd[i];
    // sum_j w_j g_j (x_j r), each term formed in double from the fp32 product x_j r.
    const auto term = [&](std::int64_t j) {
      return static_cast<double>(widen(weight[j])) * widen(gi[j]) * (widen(xi[j]) * r);
    };
    const double dot =
        avx512() ? lane_sum(c, term, [&](double* lanes) { return weighted_dot_avx512(weight, gi, xi, r, c, lanes); })
                 : lane_sum(c, term);
    const float mean = static_cast<float>(dot / static_cast<double>(c));
    const std::int64_t v = avx512() ? backward_row_avx512(dxi, dweight, gi, xi, weight, r, mean, c) : 0;
    for (std::int64_t j = v; j < c; ++j) {
      const float xhat = widen(xi[j]) * r;
      const float g = widen(gi[j]);
      dxi[j] = narrow<T>(widen(dxi[j]) + r * (widen(weight[j]) * g - xhat * mean));
      dweight[j] += g * xhat;
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  rmsnorm_forward_t(out, rstd, x, weight, n, c, eps);
}
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* weight, std::int64_t n, std::int64_t c,
                     float eps) {
  rmsnorm_forward_t(out, rstd, x, weight, n, c, eps);
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(dx, dweight, dout, x, weight, rstd, n, c);
}
void rmsnorm_backward(bf16* dx, float* dweight, const bf16* dout, const bf16* x, const bf16* weight,
                      const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(dx, dweight, dout, x, weight, rstd, n, c);
}

}  // namespace peakbound::cpu
