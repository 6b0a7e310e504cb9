// The CUDA backend's blockwise cross-entropy pieces and vocabulary row statistics,
// llm.c style: free functions over raw device pointers launched on `stream` (a
// cudaStream_t). Math, and what is written, added into or folded, are the CPU
// kernels' (kernels/cpu/cross_entropy.h, vocab_rows.h). Row statistics are one block
// per row; the row sum of exponentials accumulates in double (the CPU's in float
// sequentially: they agree at f32 tolerance, not bitwise).
#pragma once

#include <cstdint>

namespace peakbound::cuda {

void lse_update(void* stream, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum);
void gather_target_logit(void* stream, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit);
void cross_entropy_grad(void* stream, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale);
void lse_merge(void* stream, float* max_a, float* sum_a, float* target_a, const float* max_b, const float* sum_b,
               const float* target_b, std::int64_t rows);
// Writes lse [rows] and, once the stream reaches it, the summed loss and the count of
// non-ignored rows into result[0] (double) and result[1] (as a double): `result` is
// memory the device can write and the host can read (mapped pinned host memory).
void cross_entropy_finish(void* stream, const float* run_max, const float* run_sum, const float* target_logit,
                          const std::int32_t* targets, std::int64_t rows, std::int32_t ignore_index, float z_loss,
                          float* lse, double* result);

// The fused form over a block holding the whole vocabulary (kernels/cpu/cross_entropy.h):
// logits -> the gradient in place, one block per row; row r's loss goes to result[r] and
// 1 or 0 (ignored) to result[kFusedRowsPerLaunch + r], for rows <= kFusedRowsPerLaunch:
// the op launches it over row chunks and sums on the host in row order (deterministic).
inline constexpr std::int64_t kFusedRowsPerLaunch = 256;
void cross_entropy_fused_grad(void* stream, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                              const std::int32_t* targets, std::int32_t ignore_index, float z_loss, float scale,
                              double* result);

void row_max(void* stream, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* row_max);
void row_sum_exp(void* stream, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                 const float* row_max, float* row_sum);
void lse_finalize(void* stream, float* max_to_lse, const float* row_sum, std::int64_t rows);

}  // namespace peakbound::cuda
