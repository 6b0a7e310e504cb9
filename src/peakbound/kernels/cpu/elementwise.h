// Small elementwise CPU kernels and the exactness metric the tests and `verify` use.
// The bf16 forms (bf16 x, y, a, b, out) compute in fp32 exactly as the f32 forms and
// round once at the store: each bf16 output is bitwise to_bf16(the f32 form's output on
// the widened inputs). axpy into a bf16 y rounds once per call, so a sum over many calls
// (a parameter gradient) belongs in an f32 y.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/adamw_types.h"

namespace peakbound::cpu {

void fill(float* x, std::int64_t n, float v);
void scale(float* x, std::int64_t n, float a);              // x *= a
void axpy(float* y, const float* x, std::int64_t n, float a);  // y += a * x
void add(float* out, const float* a, const float* b, std::int64_t n);
void fill(bf16* x, std::int64_t n, float v);                  // x = to_bf16(v)
void axpy(bf16* y, const bf16* x, std::int64_t n, float a);    // y = to_bf16(y + a * x)
void add(bf16* out, const bf16* a, const bf16* b, std::int64_t n);  // out = to_bf16(a + b)

// Linear biases. broadcast_rows: y [rows, cols] = bias [cols] on every row (a biased
// product's start: the GEMM then adds into it). add_bias: y [rows, cols] += bias [cols] on
// every row (bf16: rounded once per element). add_column_sums: acc [cols] (fp32) += the column sums of x [rows, cols],
// each summed in double over the rows and added once (a bias's gradient).
void broadcast_rows(float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void broadcast_rows(bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols);
void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void add_bias(bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols);
void add_bias(float* y, const bf16* bias, std::int64_t rows, std::int64_t cols);  // fp32 y, bf16 bias
void add_column_sums(float* acc, const float* x, std::int64_t rows, std::int64_t cols);
void add_column_sums(float* acc, const bf16* x, std::int64_t rows, std::int64_t cols);

// Column blocks between row-major matrices (MLA's split and assembly of q, k and v):
// for r < rows and j < cols, dst[r * ldd + j] = (or, accumulate, +=) src[r * lds + c(j)],
// where c is the column order: same c(j) = j; deinterleave takes the even columns first,
// then the odd ones (c(j) = 2j for j < cols/2, else 2(j - cols/2) + 1: DeepSeek's
// interleaved RoPE pairs to rotate_half's halves); interleave is its inverse. cols must be
// even unless the order is same. Each value is widened, added in fp32 where accumulating,
// and rounded once to dst's type. dst and src must not overlap.
enum class ColumnOrder : std::uint8_t { same, deinterleave, interleave };
void copy_columns(float* dst, std::int64_t ldd, const float* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate);
void copy_columns(bf16* dst, std::int64_t ldd, const bf16* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate);
void copy_columns(float* dst, std::int64_t ldd, const bf16* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate);
void copy_columns(bf16* dst, std::int64_t ldd, const float* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate);

// Conversions, elementwise and bitwise core/dtype.h's to_bf16 / to_f32 for every input
// (ties to even, NaN stays a quiet NaN with its sign, denormals kept, overflow to inf).
// WRITE out [n]; out must not overlap in. The first two run the widest body this CPU
// has (AVX-512, AVX2, scalar); the others a chosen one (Unavailable where the CPU lacks
// it), for the tests and benchmarks. The vector bodies use integer arithmetic, never
// VCVTNEPS2BF16 (which flushes denormal inputs to zero).
void to_bf16(bf16* out, const float* in, std::int64_t n);
void to_f32(float* out, const bf16* in, std::int64_t n);
void to_bf16(SimdLevel level, bf16* out, const float* in, std::int64_t n);
void to_f32(SimdLevel level, float* out, const bf16* in, std::int64_t n);

// x[i] = to_f32(to_bf16(x[i])) in place: each value rounded to bf16 and held in fp32, bit
// for bit what to_bf16 then to_f32 make (a convert-path GEMM operand that needs neither the
// narrowed copy nor its widening: gemm_bf16.h's gemm_convert_wide_a). The chosen-level form
// as above.
void round_bf16(float* x, std::int64_t n);
void round_bf16(SimdLevel level, float* x, std::int64_t n);

// A conversion of n elements that moves at least kConvertStreamBytes (6n bytes read and
// written) writes out with non-temporal stores in the vector bodies: out is write-only
// and larger than a cache, so skipping the read for ownership saves a third of the
// traffic (16M elements, AVX-512 or AVX2 body, medians of 31 alternating runs on this
// project's 2-core AVX-512 machine: f32 -> bf16 from 18-19 to 24 GB/s, bf16 -> f32 from
// 17-18 to 24 GB/s; the scalar loop 16 and 18). Smaller ones keep plain stores so out stays in
// cache for its consumer. The bits are the same either way. The threshold is AdamW's
// (kAdamWStreamBytes).
inline constexpr std::int64_t kConvertStreamBytes = std::int64_t{64} << 20;
inline bool convert_streams(std::int64_t n) { return 6 * n >= kConvertStreamBytes; }

// max |x|
double max_abs(const float* x, std::int64_t n);
// max |a - b|
double max_abs_diff(const float* a, const float* b, std::int64_t n);
// The project's relative error: max|a - ref| / max|ref| over the whole tensor (the
// plain max|a - ref| when ref is all zeros). NaN anywhere gives NaN, never a pass.
double relative_error(const float* a, const float* ref, std::int64_t n);

}  // namespace peakbound::cpu
