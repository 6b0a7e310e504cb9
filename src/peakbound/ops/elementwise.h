// Elementwise ops on device memory, through the device's backend. The bf16 forms
// compute in fp32 and round once at the store (kernels/cpu/elementwise.h); convert is
// core/dtype.h's to_bf16 / to_f32 elementwise, bitwise on every backend.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::ops {

void fill(Device& dev, Stream& s, float* x, std::int64_t n, float v);           // x = v
void scale(Device& dev, Stream& s, float* x, std::int64_t n, float a);          // x *= a
void axpy(Device& dev, Stream& s, float* y, const float* x, std::int64_t n, float a);  // y += a x
void add(Device& dev, Stream& s, float* out, const float* a, const float* b, std::int64_t n);  // out = a + b

void fill(Device& dev, Stream& s, bf16* x, std::int64_t n, float v);                  // x = bf16(v)
void axpy(Device& dev, Stream& s, bf16* y, const bf16* x, std::int64_t n, float a);    // y = bf16(y + a x)
void add(Device& dev, Stream& s, bf16* out, const bf16* a, const bf16* b, std::int64_t n);  // out = bf16(a + b)

// Linear biases (kernels/cpu/elementwise.h; no CUDA kernel yet: Unavailable there).
// broadcast_rows: y [rows, cols] = bias [cols] on every row (then a GEMM in add mode gives a
// biased product, one rounding); add_bias: y += bias on every row; add_column_sums: acc
// [cols] (fp32) += the column sums of x.
void broadcast_rows(Device& dev, Stream& s, float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void broadcast_rows(Device& dev, Stream& s, bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols);
void add_bias(Device& dev, Stream& s, float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void add_bias(Device& dev, Stream& s, bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols);
void add_bias(Device& dev, Stream& s, float* y, const bf16* bias, std::int64_t rows, std::int64_t cols);
void add_column_sums(Device& dev, Stream& s, float* acc, const float* x, std::int64_t rows, std::int64_t cols);
void add_column_sums(Device& dev, Stream& s, float* acc, const bf16* x, std::int64_t rows, std::int64_t cols);
// Column blocks between row-major matrices, reordered or not, written or accumulated
// (kernels/cpu/elementwise.h copy_columns). CPU only so far (no_kernel on CUDA).
using cpu::ColumnOrder;
template <class D, class S>
void copy_columns(Device& dev, Stream& s, D* dst, std::int64_t ldd, const S* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order = ColumnOrder::same, bool accumulate = false);

// x[i] = to_f32(to_bf16(x[i])) in place (kernels/cpu/elementwise.h): the operand
// gemm_bf16_wide_a (ops/gemm.h) reads. CPU only: the convert path it serves is the CPU's.
void round_bf16(Device& dev, Stream& s, float* x, std::int64_t n);

// out [n] = to_bf16(in) / to_f32(in); out must not overlap in.
void convert(Device& dev, Stream& s, bf16* out, const float* in, std::int64_t n);
void convert(Device& dev, Stream& s, float* out, const bf16* in, std::int64_t n);

}  // namespace peakbound::ops
