#include "peakbound/ops/attention.h"

#include <memory>

#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/attention.h"
#include "peakbound/kernels/cpu/attention_sinks.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/kernels/cuda/attention.h"
#include "peakbound/ops/backend.h"
#include "peakbound/ops/gemm.h"

namespace peakbound::ops {

namespace {

// Runs the CPU kernel on the pool its dims.threads shares go to: the caller's, or where the
// caller gave none and the dims ask for more than one share, the process's pool of that
// many threads, the BLAS on one thread meanwhile (the shares are the rank's cores: a tile
// product split over BLAS threads too made the kernel wait on its own BLAS threads' spins,
// `bench attention`'s 0.23 against 0.14 s, docs/training.md). The bits are the same for
// every share count (kernels/cpu/attention.h, "Determinism").
template <class Kernel>
void on_kernel_threads(const AttentionDims& dims, ThreadPool* pool, Kernel&& kernel) {
  if (pool || dims.threads <= 1) {
    kernel(pool);
    return;
  }
  static KeptPool kept;
  const std::shared_ptr<ThreadPool> own = kept.sized(dims.threads);
  const BlasThreadsScope one(1);
  // OpenBLAS's idle workers stopped too (cpu::park_blas_threads): they would otherwise poll
  // with sched_yield for ~0.1 s after the last threaded GEMM, on the cores the shares run on
  // (at 1 024 tokens a kernel call fits in that window, and 2 shares ran no faster than 1).
  // Its next threaded call starts them again. The step's thread is the process's one
  // threaded BLAS caller (the shares call it with one thread), so none runs while they stop.
  if (one.changed()) cpu::park_blas_threads();
  kernel(own.get());
}

}  // namespace

// The dims are checked on the caller's thread (dispatch's check), so bad dims fail at the
// call and not on a worker stream; the CUDA kernels check them again themselves.

void attention_forward(Device& dev, Stream& s, float* out, float* lse, const float* q, const float* k,
                       const float* v, const AttentionDims& dims, float* workspace, ThreadPool* pool) {
  dispatch(dev, s, "attention_forward", {out, lse, q, k, v, workspace, pool},
           [&] { check_attention_dims(dims); },
           [&](void* stream) { cuda::attention_forward(stream, out, lse, q, k, v, dims); },
           [=] {
             on_kernel_threads(dims, pool, [&](ThreadPool* p) {
               cpu::attention_forward(out, lse, q, k, v, dims, workspace, p);
             });
           });
}

void attention_backward(Device& dev, Stream& s, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& dims, float* workspace, ThreadPool* pool, const float* row_dot) {
  dispatch(dev, s, "attention_backward", {dq, dk, dv, dout, q, k, v, out, lse, workspace, pool, row_dot},
           [&] { check_attention_dims(dims); },
           [&](void* stream) {
             cuda::attention_backward(stream, dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, row_dot);
           },
           [=] {
             on_kernel_threads(dims, pool, [&](ThreadPool* p) {
               cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, p, row_dot);
             });
           });
}

void attention_row_dot(Device& dev, Stream& s, float* row_dot, const float* dout, const float* out,
                       const AttentionDims& dims) {
  dispatch(dev, s, "attention_row_dot", {row_dot, dout, out},
           [&] { check_attention_dims(dims); },
           [&](void* stream) { cuda::attention_row_dot(stream, row_dot, dout, out, dims); },
           [=] { cpu::attention_row_dot(row_dot, dout, out, dims); });
}

namespace {

// The process's bf16 GEMM path (ops/gemm.h), read on the caller's thread so a bad
// PEAKBOUND_BF16_GEMM fails at the call; CUDA ignores it.
cpu::Bf16GemmPath gemm_path(const Device& dev) {
  return dev.backend() == Backend::cpu ? cpu::parse_bf16_gemm_path(bf16_gemm_path()) : cpu::Bf16GemmPath::convert;
}

}  // namespace

void attention_forward(Device& dev, Stream& s, float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const AttentionDims& dims, float* workspace, ThreadPool* pool) {
  const cpu::Bf16GemmPath path = gemm_path(dev);
  dispatch(dev, s, "attention_forward", {out, lse, q, k, v, workspace, pool},
           [&] { check_attention_dims(dims); },
           [&](void* stream) { cuda::attention_forward(stream, out, lse, q, k, v, dims); },
           [=] {
             on_kernel_threads(dims, pool, [&](ThreadPool* p) {
               cpu::attention_forward(out, lse, q, k, v, dims, workspace, path, p);
             });
           });
}

void attention_backward(Device& dev, Stream& s, float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* out, const float* lse, const AttentionDims& dims,
                        float* workspace, ThreadPool* pool, const float* row_dot) {
  const cpu::Bf16GemmPath path = gemm_path(dev);
  dispatch(dev, s, "attention_backward", {dq, dk, dv, dout, q, k, v, out, lse, workspace, pool, row_dot},
           [&] { check_attention_dims(dims); },
           [&](void* stream) {
             cuda::attention_backward(stream, dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, row_dot);
           },
           [=] {
             on_kernel_threads(dims, pool, [&](ThreadPool* p) {
               cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, path, p, row_dot);
             });
           });
}

void attention_row_dot(Device& dev, Stream& s, float* row_dot, const bf16* dout, const bf16* out,
                       const AttentionDims& dims) {
  dispatch(dev, s, "attention_row_dot", {row_dot, dout, out},
           [&] { check_attention_dims(dims); },
           [&](void* stream) { cuda::attention_row_dot(stream, row_dot, dout, out, dims); },
           [=] { cpu::attention_row_dot(row_dot, dout, out, dims); });
}

void attention_sinks_forward(Device& dev, Stream& s, float* out, float* lse, const float* sinks, std::int64_t T,
                             std::int64_t Hq, std::int64_t Dv) {
  dispatch(dev, s, "attention_sinks_forward", {out, lse, sinks},
           [&](void*) { no_kernel(dev, "attention_sinks_forward"); },
           [=] { cpu::attention_sinks_forward(out, lse, sinks, T, Hq, Dv); });
}

void attention_sinks_backward(Device& dev, Stream& s, float* dsinks, const float* lse, const float* row_dot,
                              const float* sinks, std::int64_t T, std::int64_t Hq) {
  dispatch(dev, s, "attention_sinks_backward", {dsinks, lse, row_dot, sinks},
           [&](void*) { no_kernel(dev, "attention_sinks_backward"); },
           [=] { cpu::attention_sinks_backward(dsinks, lse, row_dot, sinks, T, Hq); });
}

}  // namespace peakbound::ops
