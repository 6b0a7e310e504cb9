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

}  // namespace peakbound::ops
