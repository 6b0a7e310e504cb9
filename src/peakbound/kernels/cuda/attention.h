// The CUDA backend's causal GQA attention: the CPU kernel's contract (kernels/cpu/
// attention.h: shapes, key visibility with offsets and a window, the accumulate mode's
// running state and added-into gradients, lse -inf and out 0 for a row with no visible
// key), launched on `stream` (a cudaStream_t).
//
// This first CUDA version is correct, deterministic and simple, not fast: one warp per
// (query row, head) runs the online softmax over its visible keys (scores by warp
// reductions), and the backward is two passes that each own their outputs, dq per
// (query row, head) and dk, dv per (key row, kv head) looping over the queries that see
// the key, so no atomics and the same bits every run. The tiled tensor-core kernel (or
// cuDNN's fused attention) is the next step (docs/cuda.md). D and Dv are at most
// kMaxHeadDim. D_i = rowsum(dout * out) goes into the first T * Hq floats of the
// workspace when the caller does not pass row_dot (the CPU footprint's backward
// workspace has them).
#pragma once

#include <cstdint>

#include "peakbound/kernels/attention_dims.h"

namespace peakbound::cuda {

inline constexpr std::int64_t kMaxHeadDim = 256;

void attention_forward(void* stream, float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a);
void attention_backward(void* stream, float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, const float* row_dot);
void attention_row_dot(void* stream, float* row_dot, const float* dout, const float* out, const AttentionDims& a);

}  // namespace peakbound::cuda
