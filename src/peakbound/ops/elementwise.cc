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
