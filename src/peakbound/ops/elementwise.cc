#include "peakbound/ops/elementwise.h"

#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cuda/elementwise.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void fill(Device& dev, Stream& s, float* x, std::int64_t n, float v) {
  dispatch(dev, s, "fill", {x},
           [&](void* stream) { cuda::fill(stream, x, n, v); },
           [=] { cpu::fill(x, n, v); });
}

void scale(Device& dev, Stream& s, float* x, std::int64_t n, float a) {
  dispatch(dev, s, "scale", {x},
           [&](void* stream) { cuda::scale(stream, x, n, a); },
           [=] { cpu::scale(x, n, a); });
}

void axpy(Device& dev, Stream& s, float* y, const float* x, std::int64_t n, float a) {
  dispatch(dev, s, "axpy", {y, x},
           [&](void* stream) { cuda::axpy(stream, y, x, n, a); },
           [=] { cpu::axpy(y, x, n, a); });
}

void add(Device& dev, Stream& s, float* out, const float* a, const float* b, std::int64_t n) {
  dispatch(dev, s, "add", {out, a, b},
           [&](void* stream) { cuda::add(stream, out, a, b, n); },
           [=] { cpu::add(out, a, b, n); });
}

void fill(Device& dev, Stream& s, bf16* x, std::int64_t n, float v) {
  dispatch(dev, s, "fill", {x},
           [&](void* stream) { cuda::fill(stream, x, n, v); },
           [=] { cpu::fill(x, n, v); });
}

void axpy(Device& dev, Stream& s, bf16* y, const bf16* x, std::int64_t n, float a) {
  dispatch(dev, s, "axpy", {y, x},
           [&](void* stream) { cuda::axpy(stream, y, x, n, a); },
           [=] { cpu::axpy(y, x, n, a); });
}

void add(Device& dev, Stream& s, bf16* out, const bf16* a, const bf16* b, std::int64_t n) {
  dispatch(dev, s, "add", {out, a, b},
           [&](void* stream) { cuda::add(stream, out, a, b, n); },
           [=] { cpu::add(out, a, b, n); });
}

namespace {

template <class A>
void broadcast_rows_as(Device& dev, Stream& s, A* y, const A* bias, std::int64_t rows, std::int64_t cols) {
  dispatch(dev, s, "broadcast_rows", {y, bias},
           [&](void*) { no_kernel(dev, "broadcast_rows"); },
           [=] { cpu::broadcast_rows(y, bias, rows, cols); });
}

template <class A, class B>
void add_bias_as(Device& dev, Stream& s, A* y, const B* bias, std::int64_t rows, std::int64_t cols) {
  dispatch(dev, s, "add_bias", {y, bias},
           [&](void*) { no_kernel(dev, "add_bias"); },
           [=] { cpu::add_bias(y, bias, rows, cols); });
}

template <class A>
void add_column_sums_as(Device& dev, Stream& s, float* acc, const A* x, std::int64_t rows, std::int64_t cols) {
  dispatch(dev, s, "add_column_sums", {acc, x},
           [&](void*) { no_kernel(dev, "add_column_sums"); },
           [=] { cpu::add_column_sums(acc, x, rows, cols); });
}

}  // namespace

template <class D, class S>
void copy_columns(Device& dev, Stream& s, D* dst, std::int64_t ldd, const S* src, std::int64_t lds, std::int64_t rows,
                  std::int64_t cols, ColumnOrder order, bool accumulate) {
  dispatch(dev, s, "copy_columns", {dst, src},
           [&](void*) { no_kernel(dev, "copy_columns"); },
           [=] { cpu::copy_columns(dst, ldd, src, lds, rows, cols, order, accumulate); });
}
template void copy_columns(Device&, Stream&, float*, std::int64_t, const float*, std::int64_t, std::int64_t,
                           std::int64_t, ColumnOrder, bool);
template void copy_columns(Device&, Stream&, bf16*, std::int64_t, const bf16*, std::int64_t, std::int64_t,
                           std::int64_t, ColumnOrder, bool);
template void copy_columns(Device&, Stream&, float*, std::int64_t, const bf16*, std::int64_t, std::int64_t,
                           std::int64_t, ColumnOrder, bool);
template void copy_columns(Device&, Stream&, bf16*, std::int64_t, const float*, std::int64_t, std::int64_t,
                           std::int64_t, ColumnOrder, bool);

void broadcast_rows(Device& dev, Stream& s, float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  broadcast_rows_as(dev, s, y, bias, rows, cols);
}
void broadcast_rows(Device& dev, Stream& s, bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols) {
  broadcast_rows_as(dev, s, y, bias, rows, cols);
}
void add_bias(Device& dev, Stream& s, float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  add_bias_as(dev, s, y, bias, rows, cols);
}
void add_bias(Device& dev, Stream& s, bf16* y, const bf16* bias, std::int64_t rows, std::int64_t cols) {
  add_bias_as(dev, s, y, bias, rows, cols);
}
void add_bias(Device& dev, Stream& s, float* y, const bf16* bias, std::int64_t rows, std::int64_t cols) {
  add_bias_as(dev, s, y, bias, rows, cols);
}
void add_column_sums(Device& dev, Stream& s, float* acc, const float* x, std::int64_t rows, std::int64_t cols) {
  add_column_sums_as(dev, s, acc, x, rows, cols);
}
void add_column_sums(Device& dev, Stream& s, float* acc, const bf16* x, std::int64_t rows, std::int64_t cols) {
  add_column_sums_as(dev, s, acc, x, rows, cols);
}

void round_bf16(Device& dev, Stream& s, float* x, std::int64_t n) {
  dispatch(dev, s, "round_bf16", {x}, [&](void*) { no_kernel(dev, "round_bf16"); }, [=] { cpu::round_bf16(x, n); });
}

void convert(Device& dev, Stream& s, bf16* out, const float* in, std::int64_t n) {
  dispatch(dev, s, "convert", {out, in},
           [&](void* stream) { cuda::convert(stream, out, in, n); },
           [=] { cpu::to_bf16(out, in, n); });
}

void convert(Device& dev, Stream& s, float* out, const bf16* in, std::int64_t n) {
  dispatch(dev, s, "convert", {out, in},
           [&](void* stream) { cuda::convert(stream, out, in, n); },
           [=] { cpu::to_f32(out, in, n); });
}

}  // namespace peakbound::ops
