#include "peakbound/ops/swiglu.h"

#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cpu/swiglu.h"
#include "peakbound/kernels/cuda/elementwise.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void swiglu_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n) {
  check_device_pointers(dev, "swiglu_forward", {out, gate, up});
  PB_ON_CUDA(dev, s, cuda::swiglu_forward(stream, out, gate, up, n))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "swiglu_forward");
  cpu::launch(s, [=] { cpu::swiglu_forward(out, gate, up, n); });
}

void swiglu_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n) {
  check_device_pointers(dev, "swiglu_backward", {dgate, dup, dout, gate, up});
  PB_ON_CUDA(dev, s, cuda::swiglu_backward(stream, dgate, dup, dout, gate, up, n))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "swiglu_backward");
  cpu::launch(s, [=] { cpu::swiglu_backward(dgate, dup, dout, gate, up, n); });
}

}  // namespace peakbound::ops
