#include "peakbound/ops/host_attention.h"

#include "peakbound/kernels/cpu/attention.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/gemm.h"

namespace peakbound::ops {

void host_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                            const AttentionDims& dims, float* workspace, ThreadPool* pool) {
  cpu::attention_forward(out, lse, q, k, v, dims, workspace, pool);
}

void host_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse, const AttentionDims& dims,
                             float* workspace, ThreadPool* pool, const float* row_dot) {
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, workspace, pool, row_dot);
}

void host_attention_forward(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            const AttentionDims& dims, float* workspace, ThreadPool* pool) {
  cpu::attention_forward(out, lse, q, k, v, dims, workspace, cpu::parse_bf16_gemm_path(bf16_gemm_path()), pool);
}

void host_attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                             const bf16* v, const bf16* out, const float* lse, const AttentionDims& dims,
                             float* workspace, ThreadPool* pool, const float* row_dot) {
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, dims, workspace,
                          cpu::parse_bf16_gemm_path(bf16_gemm_path()), pool, row_dot);
}

}  // namespace peakbound::ops
