// The CUDA backend's causal GQA attention: the CPU kernel's contract (kernels/cpu/
// attention.h: shapes, key visibility with offsets and a window, the accumulate mode's
// running state and added-into gradients, lse -inf and out 0 for a row with no visible
// key), launched on `stream` (a cudaStream_t).
//
// Two forms, both deterministic (each output owned by one thread or warp: no atomics, the
// same bits every run), the backward in two passes that own dq, and dk with dv:
// - tiled (D and Dv up to 64): one thread per query row (forward, dq) or key row (dk, dv),
//   64 rows of one head a block, the other side's rows staged through shared memory 32 at a
//   time as fp32; the forward takes each tile's row maximum first and rescales once per
//   tile. On one H200 (tiny-moe, 4096 tokens, head dim 32) the step ran 2.1x (bf16) and
//   3.3x (f32) the simple form's tokens/s. SIMT fp32, no tensor cores; at 64 the dq and
//   dk/dv kernels spill 0.3-1.8 KB of registers.
// - simple (any head dim up to kMaxHeadDim; PEAKBOUND_CUDA_ATTENTION=simple forces it):
//   one warp per (row, head), scores by warp reductions, the online softmax per key.
// Tensor-core tiles (or cuDNN's fused attention) are the next step (docs/cuda.md). D_i = rowsum(dout * out) goes into the first T * Hq floats of the
// workspace when the caller does not pass row_dot (the CPU footprint's backward
// workspace has them).
//
// Mixed precision: the bf16 overloads take q, k, v, dout and the saved out in bf16,
// widen each element as it is loaded (exact) and compute in fp32 as the f32 kernels do;
// out, lse, row_dot, dq, dk, dv stay fp32 (the CPU kernel's contract: fp32 running state
// and gradient accumulators, narrowed once by the caller after the last key block).
// Unlike the CPU's tiled form they round no P or dS to bf16 (no tile GEMMs here), so
// they differ from it by that rounding: tests/kernels/attention_gpu_test.cc's bound.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/attention_dims.h"

namespace peakbound::cuda {

inline constexpr std::int64_t kMaxHeadDim = 256;

void attention_forward(void* stream, float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a);
void attention_backward(void* stream, float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, const float* row_dot);
void attention_row_dot(void* stream, float* row_dot, const float* dout, const float* out, const AttentionDims& a);

void attention_forward(void* stream, float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const AttentionDims& a);
void attention_backward(void* stream, float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* out, const float* lse, const AttentionDims& a,
                        float* workspace, const float* row_dot);
void attention_row_dot(void* stream, float* row_dot, const bf16* dout, const bf16* out, const AttentionDims& a);

}  // namespace peakbound::cuda
