// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "peakbound/kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"

#define PB_AVX2 __attribute__((target("avx2")))
#define PB_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace peakbound::cpu {

namespace {

// Written once over the storage type (core/dtype.h): with T = float these are the f32
// kernels' loops, operation for operation.
template <typename T>
void fill_t(T* x, std::int64_t n, float v) {
  const T t = narrow<T>(v);
  // +0 (all bits clear; -0 is not): memset, whose string stores skip reading the lines
  // they overwrite (the gradient buffers zeroed every step: 20-25% less time a byte here).
  if (n > 0 && std::bit_cast<std::array<unsigned char, sizeof(T)>>(t) == std::array<unsigned char, sizeof(T)>{}) {
    std::memset(static_cast<void*>(x), 0, static_cast<std::size_t>(n) * sizeof(T));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) x[i] = t;
}

template <typename T>
void axpy_t(T* y, const T* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = narrow<T>(widen(y[i]) + a * widen(x[i]));
}

template <typename T>
void add_t(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = narrow<T>(widen(a[i]) + widen(b[i]));
}

template <typename T>
void broadcast_rows_t(T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) std::copy(bias, bias + cols, y + r * cols);
}

template <typename T, typename B>
void add_bias_t(T* y, const B* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = narrow<T>(widen(y[r * cols + c]) + widen(bias[c]));
}

template <typename D, typename S>
void copy_columns_t(D* dst, std::int64_t ldd, const S* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                    ColumnOrder order, bool accumulate) {
  if (rows < 0 || cols < 0 || ldd < cols || lds < cols || (order != ColumnOrder::same && cols % 2 != 0))
    throw InvalidArgument("copy_columns: need rows, cols >= 0, ldd and lds >= cols and an even cols to reorder (rows " +
                          std::to_string(rows) + ", cols " + std::to_string(cols) + ", ldd " + std::to_string(ldd) +
                          ", lds " + std::to_string(lds) + ")");
  const std::int64_t half = cols / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    D* d = dst + r * ldd;
    const S* x = src + r * lds;
    for (std::int64_t j = 0; j < cols; ++j) {
      std::int64_t c = j;
      if (order == ColumnOrder::deinterleave) c = j < half ? 2 * j : 2 * (j - half) + 1;
      if (order == ColumnOrder::interleave) c = j % 2 == 0 ? j / 2 : half + j / 2;
      d[j] = narrow<D>(accumulate ? widen(d[j]) + widen(x[c]) : widen(x[c]));
    }
  }
}

template <typename T>
void add_column_sums_t(float* acc, const T* x, std::int64_t rows, std::int64_t cols) {
  std::vector<double> sum(static_cast<std::size_t>(cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) sum[static_cast<std::size_t>(c)] += widen(x[r * cols + c]);
  for (std::int64_t c = 0; c < cols; ++c) acc[c] = static_cast<float>(acc[c] + sum[static_cast<std::size_t>(c)]);
}

void to_bf16_scalar(bf16* out, const float* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = peakbound::to_bf16(in[i]);
}

void to_f32_scalar(float* out, const bf16* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = peakbound::to_f32(in[i]);
}

// Elements of out before its first `align`-byte boundary (at most n), or -1 when out
// is not aligned to its own element size (then it gets plain stores).
template <typename T>
std::int64_t head_before(const T* out, std::uintptr_t align, std::int64_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(out);
  if (addr % sizeof(T) != 0) return -1;
  const auto head = static_cast<std::int64_t>(((align - addr % align) % align) / sizeof(T));
  return head < n ? head : n;
}

// The vector bodies convert vectors from the start, the tail by the scalar body. With
// `stream` (head >= 0), out is written with non-temporal stores from its first boundary
// of the store's width on (the `head` elements before it by the scalar body), then an
// sfence.

// 16 floats -> 16 bf16 per vector (to_bf16's arithmetic lane by lane, bf16_lanes.h; two
// halves packed: packus keeps lanes <= 0xffff as they are and works within 128-bit halves,
// hence the permute).
PB_AVX2 void to_bf16_avx2(bf16* out, const float* in, std::int64_t n, bool stream) {
  const std::int64_t head = stream ? head_before(out, 32, n) : -1;
  std::int64_t i = head > 0 ? head : 0;
  to_bf16_scalar(out, in, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i a = simd::to_bf16_lanes8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i b = simd::to_bf16_lanes8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    if (head >= 0) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), packed);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  if (head >= 0) _mm_sfence();
  to_bf16_scalar(out + i, in + i, n - i);
}

PB_AVX2 void to_f32_avx2(float* out, const bf16* in, std::int64_t n, bool stream) {
  const std::int64_t head = stream ? head_before(out, 32, n) : -1;
  std::int64_t i = head > 0 ? head : 0;
  to_f32_scalar(out, in, i);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i f = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    if (head >= 0) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), f);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), f);
  }
  if (head >= 0) _mm_sfence();
  to_f32_scalar(out + i, in + i, n - i);
}

PB_AVX512 void to_bf16_avx512(bf16* out, const float* in, std::int64_t n, bool stream) {
  const std::int64_t head = stream ? head_before(out, 32, n) : -1;
  std::int64_t i = head > 0 ? head : 0;
  to_bf16_scalar(out, in, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = simd::to_bf16x16(_mm512_loadu_ps(in + i));
    if (head >= 0) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), h);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
  if (head >= 0) _mm_sfence();
  to_bf16_scalar(out + i, in + i, n - i);
}

// x[i] = to_f32(to_bf16(x[i])) in place: the rounded values kept in fp32 (bf16_lanes.h's
// store_rounded), 8 or 16 lanes at a time, the tail by the scalar form.
void round_bf16_scalar(float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) simd::store_rounded(x + i, x[i]);
}
PB_AVX2 void round_bf16_avx2(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) simd::store_rounded8(x + i, _mm256_loadu_ps(x + i));
  round_bf16_scalar(x + i, n - i);
}
PB_AVX512 void round_bf16_avx512(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) simd::store_rounded16(x + i, _mm512_loadu_ps(x + i));
  round_bf16_scalar(x + i, n - i);
}

PB_AVX512 void to_f32_avx512(float* out, const bf16* in, std::int64_t n, bool stream) {
  const std::int64_t head = stream ? head_before(out, 64, n) : -1;
  std::int64_t i = head > 0 ? head : 0;
  to_f32_scalar(out, in, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m512i f = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    if (head >= 0) _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i), f);
    else _mm512_storeu_si512(out + i, f);
  }
  if (head >= 0) _mm_sfence();
  to_f32_scalar(out + i, in + i, n - i);
}

void check_level(SimdLevel level, const char* what) {
  if (!simd_level_supported(level))
    throw Unavailable(std::string(what) + ": this CPU does not support " + std::string(simd_level_name(level)));
}

// The widest level, asked of the CPU once.
SimdLevel convert_level() {
  static const SimdLevel level = best_simd_level();
  return level;
}

}  // namespace

void fill(float* x, std::int64_t n, float v) { fill_t(x, n, v); }
void fill(bf16* x, std::int64_t n, float v) { fill_t(x, n, v); }

void broadcast_rows(float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  broadcast_rows_t(y, bias, rows, cols);
}
void broadcast_rows(bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols) {
  broadcast_rows_t(y, bias, rows, cols);
}
void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols) { add_bias_t(y, bias, rows, cols); }
void add_bias(bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols) { add_bias_t(y, bias, rows, cols); }
void add_bias(float* y, const bf16* bias, std::int64_t rows, std::int64_t cols) { add_bias_t(y, bias, rows, cols); }
void add_column_sums(float* acc, const float* x, std::int64_t rows, std::int64_t cols) {
  add_column_sums_t(acc, x, rows, cols);
}
void copy_columns(float* dst, std::int64_t ldd, const float* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate) {
  copy_columns_t(dst, ldd, src, lds, rows, cols, order, accumulate);
}
void copy_columns(bf16* dst, std::int64_t ldd, const bf16* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate) {
  copy_columns_t(dst, ldd, src, lds, rows, cols, order, accumulate);
}
void copy_columns(float* dst, std::int64_t ldd, const bf16* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate) {
  copy_columns_t(dst, ldd, src, lds, rows, cols, order, accumulate);
}
void copy_columns(bf16* dst, std::int64_t ldd, const float* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate) {
  copy_columns_t(dst, ldd, src, lds, rows, cols, order, accumulate);
}
void add_column_sums(float* acc, const bf16* x, std::int64_t rows, std::int64_t cols) {
  add_column_sums_t(acc, x, rows, cols);
}

void scale(float* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= a;
}

void axpy(float* y, const float* x, std::int64_t n, float a) { axpy_t(y, x, n, a); }
void axpy(bf16* y, const bf16* x, std::int64_t n, float a) { axpy_t(y, x, n, a); }

void add(float* out, const float* a, const float* b, std::int64_t n) { add_t(out, a, b, n); }
void add(bf16* out, const bf16* a, const bf16* b, std::int64_t n) { add_t(out, a, b, n); }

void to_bf16(SimdLevel level, bf16* out, const float* in, std::int64_t n) {
  check_level(level, "to_bf16");
  switch (level) {
    case SimdLevel::scalar: to_bf16_scalar(out, in, n); break;
    case SimdLevel::avx2: to_bf16_avx2(out, in, n, convert_streams(n)); break;
    case SimdLevel::avx512: to_bf16_avx512(out, in, n, convert_streams(n)); break;
  }
}

void to_f32(SimdLevel level, float* out, const bf16* in, std::int64_t n) {
  check_level(level, "to_f32");
  switch (level) {
    case SimdLevel::scalar: to_f32_scalar(out, in, n); break;
    case SimdLevel::avx2: to_f32_avx2(out, in, n, convert_streams(n)); break;
    case SimdLevel::avx512: to_f32_avx512(out, in, n, convert_streams(n)); break;
  }
}

void round_bf16(SimdLevel level, float* x, std::int64_t n) {
  check_level(level, "round_bf16");
  switch (level) {
    case SimdLevel::scalar: round_bf16_scalar(x, n); break;
    case SimdLevel::avx2: round_bf16_avx2(x, n); break;
    case SimdLevel::avx512: round_bf16_avx512(x, n); break;
  }
}
void round_bf16(float* x, std::int64_t n) { round_bf16(convert_level(), x, n); }
void to_bf16(bf16* out, const float* in, std::int64_t n) { to_bf16(convert_level(), out, in, n); }
void to_f32(float* out, const bf16* in, std::int64_t n) { to_f32(convert_level(), out, in, n); }

double max_abs(const float* x, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double v = std::fabs(static_cast<double>(x[i]));
    if (std::isnan(v)) return std::numeric_limits<double>::quiet_NaN();
    if (v > m) m = v;
  }
  return m;
}

double max_abs_diff(const float* a, const float* b, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    if (d > m) m = d;
  }
  return m;
}

double relative_error(const float* a, const float* ref, std::int64_t n) {
  double diff = max_abs_diff(a, ref, n);
  double scale = max_abs(ref, n);
  if (std::isnan(diff) || std::isnan(scale)) return std::numeric_limits<double>::quiet_NaN();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace peakbound::cpu
