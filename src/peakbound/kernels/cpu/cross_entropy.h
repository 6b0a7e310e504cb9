// Blockwise pieces of a vocabulary-sharded cross-entropy, for a block of logits
// [rows, cols] (row stride ld) holding vocabulary ids [vocab_offset, vocab_offset+cols).
// Rows are tokens; a token whose target is `ignore_index` contributes nothing.
// Per-token loss = lse - logit[target] + z * lse^2 (z-loss; z = 0 disables it).
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// Online log-sum-exp: folds the block into the running max and running sum per row
// (start from max = -inf, sum = 0). lse = max + log(sum) once every block is folded.
void lse_update(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum);

// Adds the target's logit to target_logit[r] for rows whose target lies in this block.
void gather_target_logit(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit);

// In place: logits -> scale * d(loss)/d(logits) = scale * (softmax * (1 + 2 z lse) - onehot),
// zero for ignored rows. lse holds each row's complete log-sum-exp.
void cross_entropy_grad(float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale);

// Finishes rows: lse[r] = max + log(sum); returns the summed loss over non-ignored rows
// (double) and counts them in *count.
double cross_entropy_finish(const float* run_max, const float* run_sum, const float* target_logit,
                            const std::int32_t* targets, std::int64_t rows, std::int32_t ignore_index,
                            float z_loss, float* lse, std::int64_t* count);

// The fused form, for a block that holds the WHOLE vocabulary (cols = V, ids 0..V-1):
// in place, logits -> scale * (softmax * (1 + 2 z lse) - onehot) (zero for ignored
// rows), in three passes per row (max; exp(l - max) stored and summed; scaled) with one
// exp per element. Returns the summed loss (lse - logit[target] + z lse^2, double) over
// non-ignored rows and counts them in *count. The same math as lse_update +
// gather_target_logit + cross_entropy_finish + cross_entropy_grad over one block.
double cross_entropy_fused_grad(float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                const std::int32_t* targets, std::int32_t ignore_index, float z_loss, float scale,
                                std::int64_t* count);

}  // namespace peakbound::cpu

namespace peakbound::cpu {

// Merges partial row statistics b into a (both from lse_update over disjoint vocab
// blocks, plus their target logits): a := a (+) b.
void lse_merge(float* max_a, float* sum_a, float* target_a, const float* max_b, const float* sum_b,
               const float* target_b, std::int64_t rows);

}  // namespace peakbound::cpu
