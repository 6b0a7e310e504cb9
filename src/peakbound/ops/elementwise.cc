#include "peakbound/ops/elementwise.h"

#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cuda/elementwise.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void fill(Device& dev, Stream& s, float* x, std::int64_t n, float v) {
  check_device_pointers(dev, "fill", {x});
  PB_ON_CUDA(dev, s, cuda::fill(stream, x, n, v))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "fill");
  cpu::launch(s, [=] { cpu::fill(x, n, v); });
}

void scale(Device& dev, Stream& s, float* x, std::int64_t n, float a) {
  check_device_pointers(dev, "scale", {x});
  PB_ON_CUDA(dev, s, cuda::scale(stream, x, n, a))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "scale");
  cpu::launch(s, [=] { cpu::scale(x, n, a); });
}

void axpy(Device& dev, Stream& s, float* y, const float* x, std::int64_t n, float a) {
  check_device_pointers(dev, "axpy", {y, x});
  PB_ON_CUDA(dev, s, cuda::axpy(stream, y, x, n, a))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "axpy");
  cpu::launch(s, [=] { cpu::axpy(y, x, n, a); });
}

void add(Device& dev, Stream& s, float* out, const float* a, const float* b, std::int64_t n) {
  check_device_pointers(dev, "add", {out, a, b});
  PB_ON_CUDA(dev, s, cuda::add(stream, out, a, b, n))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "add");
  cpu::launch(s, [=] { cpu::add(out, a, b, n); });
}

}  // namespace peakbound::ops
