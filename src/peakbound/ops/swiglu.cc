#include "peakbound/ops/swiglu.h"

#include "peakbound/kernels/cpu/swiglu.h"
#include "peakbound/kernels/cuda/elementwise.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void swiglu_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n) {
  dispatch(dev, s, "swiglu_forward", {out, gate, up},
           [&](void* stream) { cuda::swiglu_forward(stream, out, gate, up, n); },
           [=] { cpu::swiglu_forward(out, gate, up, n); });
}

void swiglu_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n) {
  dispatch(dev, s, "swiglu_backward", {dgate, dup, dout, gate, up},
           [&](void* stream) { cuda::swiglu_backward(stream, dgate, dup, dout, gate, up, n); },
           [=] { cpu::swiglu_backward(dgate, dup, dout, gate, up, n); });
}

void swiglu_forward(Device& dev, Stream& s, bf16* out, const bf16* gate, const bf16* up, std::int64_t n) {
  dispatch(dev, s, "swiglu_forward", {out, gate, up},
           [&](void* stream) { cuda::swiglu_forward(stream, out, gate, up, n); },
           [=] { cpu::swiglu_forward(out, gate, up, n); });
}

void swiglu_backward(Device& dev, Stream& s, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                     const bf16* up, std::int64_t n) {
  dispatch(dev, s, "swiglu_backward", {dgate, dup, dout, gate, up},
           [&](void* stream) { cuda::swiglu_backward(stream, dgate, dup, dout, gate, up, n); },
           [=] { cpu::swiglu_backward(dgate, dup, dout, gate, up, n); });
}

namespace {

template <class A>
void clamped_forward(Device& dev, Stream& s, A* out, const A* gate, const A* up, std::int64_t n, SwigluClamp c) {
  const cpu::ClampedSwiglu k{c.alpha, c.limit};
  dispatch(dev, s, "swiglu_clamped_forward", {out, gate, up},
           [&](void*) { no_kernel(dev, "swiglu_clamped_forward"); },
           [=] { cpu::swiglu_clamped_forward(out, gate, up, n, k); });
}

template <class A>
void clamped_backward(Device& dev, Stream& s, A* dgate, A* dup, const A* dout, const A* gate, const A* up,
                      std::int64_t n, SwigluClamp c) {
  const cpu::ClampedSwiglu k{c.alpha, c.limit};
  dispatch(dev, s, "swiglu_clamped_backward", {dgate, dup, dout, gate, up},
           [&](void*) { no_kernel(dev, "swiglu_clamped_backward"); },
           [=] { cpu::swiglu_clamped_backward(dgate, dup, dout, gate, up, n, k); });
}

}  // namespace

void swiglu_clamped_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n,
                            SwigluClamp c) {
  clamped_forward(dev, s, out, gate, up, n, c);
}
void swiglu_clamped_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                             const float* up, std::int64_t n, SwigluClamp c) {
  clamped_backward(dev, s, dgate, dup, dout, gate, up, n, c);
}
void swiglu_clamped_forward(Device& dev, Stream& s, bf16* out, const bf16* gate, const bf16* up, std::int64_t n,
                            SwigluClamp c) {
  clamped_forward(dev, s, out, gate, up, n, c);
}
void swiglu_clamped_backward(Device& dev, Stream& s, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                             const bf16* up, std::int64_t n, SwigluClamp c) {
  clamped_backward(dev, s, dgate, dup, dout, gate, up, n, c);
}

}  // namespace peakbound::ops
