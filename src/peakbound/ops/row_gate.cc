#include "peakbound/ops/row_gate.h"

#include "peakbound/kernels/cpu/row_gate.h"
#include "peakbound/kernels/cuda/layers.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

namespace {

// S: the storage of x, out, dout, dx and dz (float or bf16); z is fp32.
template <typename S>
void forward(Device& dev, Stream& s, S* out, const S* x, const float* z, std::int64_t m, std::int64_t n,
             bool accumulate) {
  dispatch(dev, s, "row_gate_forward", {out, x, z},
           [&](void* stream) { cuda::row_gate_forward(stream, out, x, z, m, n, accumulate); },
           [=] { cpu::row_gate_forward(out, x, z, m, n, accumulate); });
}

template <typename S>
void backward(Device& dev, Stream& s, S* dx, S* dz, const S* dout, const S* x, const float* z, std::int64_t m,
              std::int64_t n) {
  dispatch(dev, s, "row_gate_backward", {dx, dz, dout, x, z},
           [&](void* stream) { cuda::row_gate_backward(stream, dx, dz, dout, x, z, m, n); },
           [=] { cpu::row_gate_backward(dx, dz, dout, x, z, m, n); });
}

}  // namespace

void row_gate_forward(Device& dev, Stream& s, float* out, const float* x, const float* z, std::int64_t m,
                      std::int64_t n, bool accumulate) {
  forward(dev, s, out, x, z, m, n, accumulate);
}

void row_gate_forward(Device& dev, Stream& s, bf16* out, const bf16* x, const float* z, std::int64_t m,
                      std::int64_t n, bool accumulate) {
  forward(dev, s, out, x, z, m, n, accumulate);
}

void row_gate_backward(Device& dev, Stream& s, float* dx, float* dz, const float* dout, const float* x,
                       const float* z, std::int64_t m, std::int64_t n) {
  backward(dev, s, dx, dz, dout, x, z, m, n);
}

void row_gate_backward(Device& dev, Stream& s, bf16* dx, bf16* dz, const bf16* dout, const bf16* x,
                       const float* z, std::int64_t m, std::int64_t n) {
  backward(dev, s, dx, dz, dout, x, z, m, n);
}

}  // namespace peakbound::ops
