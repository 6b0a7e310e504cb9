#include "peakbound/ops/attention.h"

#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cuda/attention.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void attention_forward(Device& dev, Stream& s, float* out, float* lse, const float* q, const float* k,
                       const float* v, const AttentionDims& dims, float* workspace, ThreadPool* pool) {
  check_device_pointers(dev, "attention_forward", {out, lse, q, k, v, workspace, pool});
  PB_ON_CUDA(dev, s, cuda::attention_forward(stream, out, lse, q, k, v, dims))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "attention_forward");
  // Checked now, on the caller's thread, so bad dims fail here and not on a worker stream.
  cpu::check_attention_dims(dims);
  cpu::launch(s, [=] { cpu::attention_forward(out, lse, q, k, v, dims, workspace, pool); });
}

void attention_backward(Device& dev, Stream& s, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& dims, float* workspace, ThreadPool* pool, const float* row_dot) {
  check_device_pointers(dev, "attention_backward", {dq, dk, dv, dout, q, k, v, out, lse, workspace, pool, row_dot});
  PB_ON_CUDA(dev, s, cuda::attention_backward(stream, dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, row_dot))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "attention_backward");
  cpu::check_attention_dims(dims);
  cpu::launch(s, [=] { cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, pool, row_dot); });
}

void attention_row_dot(Device& dev, Stream& s, float* row_dot, const float* dout, const float* out,
                       const AttentionDims& dims) {
  check_device_pointers(dev, "attention_row_dot", {row_dot, dout, out});
  PB_ON_CUDA(dev, s, cuda::attention_row_dot(stream, row_dot, dout, out, dims))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "attention_row_dot");
  cpu::check_attention_dims(dims);
  cpu::launch(s, [=] { cpu::attention_row_dot(row_dot, dout, out, dims); });
}

}  // namespace peakbound::ops
