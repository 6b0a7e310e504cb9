// Causal GQA flash attention on HOST memory, run by the host CPU whatever the device:
// the single-rank reference of the exactness harness (verify/attention_reference.h)
// and `bench attention`'s timing of the CPU kernel call it on plain host vectors. Same
// contract, same bits as the CPU kernel the device op runs (kernels/cpu/attention.h:
// shapes, workspace, pool shares); the device-memory op is ops/attention.h.
#pragma once

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/attention_dims.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::ops {

// out [T, Hq, Dv], lse [T, Hq] WRITTEN (dims.accumulate: read and written back merged).
// workspace: attention_forward_workspace_floats(dims) floats. pool: runs dims.threads
// shares on it (null: one after another on the caller). Returns when done.
void host_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                            const AttentionDims& dims, float* workspace, ThreadPool* pool = nullptr);

// dq, dk, dv WRITTEN (dims.accumulate: ADDED INTO); row_dot as in ops::attention_backward.
// workspace: attention_backward_workspace_floats(dims, row_dot != nullptr) floats.
void host_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse, const AttentionDims& dims,
                             float* workspace, ThreadPool* pool = nullptr, const float* row_dot = nullptr);

// The bf16 kernel (q, k, v, dout, out bf16; out, lse, dq, dk, dv fp32), its tile products on
// the process's bf16 GEMM path (ops/gemm.h bf16_gemm_path()). Workspace sizes with
// DType::bf16 (kernels/attention_dims.h).
void host_attention_forward(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            const AttentionDims& dims, float* workspace, ThreadPool* pool = nullptr);
void host_attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                             const bf16* v, const bf16* out, const float* lse, const AttentionDims& dims,
                             float* workspace, ThreadPool* pool = nullptr, const float* row_dot = nullptr);

}  // namespace peakbound::ops
