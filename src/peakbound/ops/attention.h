// Causal GQA self-attention through the device's backend (kernels/cpu/attention.h for
// the shapes, the math and the workspace sizes): forward WRITES out [T, Hq, Dv] and
// lse [T, Hq]; backward WRITES dq, dk, dv (dims.accumulate: the forward reads out/lse as
// a running state and writes it back merged, the backward ADDS INTO dq, dk, dv; blocks at
// global offsets, as the kernel's header says). The caller passes the workspace, sized by
// attention_{forward,backward}_workspace_floats(dims) (kernels/attention_dims.h). The dims
// struct is plain data, shared with any later backend. attention_row_dot WRITES row_dot
// [T, Hq] = rowsum(dout * out), which the backward then READS instead of computing it.
#pragma once

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"
#include "peakbound/kernels/attention_dims.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::ops {

using AttentionDims = ::peakbound::AttentionDims;  // kernels/attention_dims.h

// pool: the CPU backend runs dims.threads shares on it. Null: with dims.threads > 1 on the
// process's pool of that many threads (the stream's thread one of them), the BLAS on one
// thread while the kernel runs (a rank's cores share the kernel, not its tile products);
// with 1, on the stream's thread. The same bits every way.
void attention_forward(Device& dev, Stream& s, float* out, float* lse, const float* q, const float* k,
                       const float* v, const AttentionDims& dims, float* workspace, ThreadPool* pool = nullptr);
void attention_backward(Device& dev, Stream& s, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& dims, float* workspace, ThreadPool* pool = nullptr,
                        const float* row_dot = nullptr);
void attention_row_dot(Device& dev, Stream& s, float* row_dot, const float* dout, const float* out,
                       const AttentionDims& dims);

// Mixed precision (kernels/cpu/attention.h, "Mixed precision"): bf16 q, k, v, dout and
// the saved out; out, lse, row_dot, dq, dk, dv stay fp32 (out and the gradients are
// fp32 accumulators across key blocks; the caller narrows once after the last). On the
// CPU the tile products run on ops::bf16_gemm_path(), read on the caller's thread; the
// workspace is sized with DType::bf16 (kernels/attention_dims.h).
void attention_forward(Device& dev, Stream& s, float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const AttentionDims& dims, float* workspace, ThreadPool* pool = nullptr);
void attention_backward(Device& dev, Stream& s, float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* out, const float* lse, const AttentionDims& dims,
                        float* workspace, ThreadPool* pool = nullptr, const float* row_dot = nullptr);
void attention_row_dot(Device& dev, Stream& s, float* row_dot, const bf16* dout, const bf16* out,
                       const AttentionDims& dims);

// Attention sinks (gpt-oss; kernels/cpu/attention_sinks.h; no CUDA kernel yet: Unavailable
// there). Forward: out [T, Hq, Dv] (fp32 state) and lse [T, Hq] READ and WRITTEN, the sinks
// [Hq] merged into the finished rows. Backward: dsinks [Hq] ADDED INTO from the merged lse
// and row_dot (attention_row_dot of the merged out).
void attention_sinks_forward(Device& dev, Stream& s, float* out, float* lse, const float* sinks, std::int64_t T,
                             std::int64_t Hq, std::int64_t Dv);
void attention_sinks_backward(Device& dev, Stream& s, float* dsinks, const float* lse, const float* row_dot,
                              const float* sinks, std::int64_t T, std::int64_t Hq);

}  // namespace peakbound::ops
