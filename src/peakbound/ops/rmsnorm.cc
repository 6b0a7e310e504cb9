#include "peakbound/ops/rmsnorm.h"

#include "peakbound/kernels/cpu/rmsnorm.h"
#include "peakbound/kernels/cuda/elementwise.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void rmsnorm_forward(Device& dev, Stream& s, float* out, float* rstd, const float* x, const float* weight,
                     std::int64_t n, std::int64_t c, float eps) {
  dispatch(dev, s, "rmsnorm_forward", {out, rstd, x, weight},
           [&](void* stream) { cuda::rmsnorm_forward(stream, out, rstd, x, weight, n, c, eps); },
           [=] { cpu::rmsnorm_forward(out, rstd, x, weight, n, c, eps); });
}

void rmsnorm_backward(Device& dev, Stream& s, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c) {
  dispatch(dev, s, "rmsnorm_backward", {dx, dweight, dout, x, weight, rstd},
           [&](void* stream) { cuda::rmsnorm_backward(stream, dx, dweight, dout, x, weight, rstd, n, c); },
           [=] { cpu::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, n, c); });
}

void rmsnorm_forward(Device& dev, Stream& s, bf16* out, float* rstd, const bf16* x, const bf16* weight,
                     std::int64_t n, std::int64_t c, float eps) {
  dispatch(dev, s, "rmsnorm_forward", {out, rstd, x, weight},
           [&](void* stream) { cuda::rmsnorm_forward(stream, out, rstd, x, weight, n, c, eps); },
           [=] { cpu::rmsnorm_forward(out, rstd, x, weight, n, c, eps); });
}

void rmsnorm_backward(Device& dev, Stream& s, bf16* dx, float* dweight, const bf16* dout, const bf16* x,
                      const bf16* weight, const float* rstd, std::int64_t n, std::int64_t c) {
  dispatch(dev, s, "rmsnorm_backward", {dx, dweight, dout, x, weight, rstd},
           [&](void* stream) { cuda::rmsnorm_backward(stream, dx, dweight, dout, x, weight, rstd, n, c); },
           [=] { cpu::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, n, c); });
}

}  // namespace peakbound::ops
