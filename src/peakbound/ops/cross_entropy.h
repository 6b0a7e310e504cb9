// The blockwise pieces of a vocabulary-sharded cross-entropy through the device's
// backend (math and argument meanings: kernels/cpu/cross_entropy.h). All buffers are
// device memory. cross_entropy_finish returns to the caller, so it waits for s.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void lse_update(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum);
void gather_target_logit(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld, const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit);
void cross_entropy_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale);
void lse_merge(Device& dev, Stream& s, float* max_a, float* sum_a, float* target_a, const float* max_b,
               const float* sum_b, const float* target_b, std::int64_t rows);
// Writes lse [rows]; returns the summed loss over non-ignored rows and their count.
double cross_entropy_finish(Device& dev, Stream& s, const float* run_max, const float* run_sum,
                            const float* target_logit, const std::int32_t* targets, std::int64_t rows,
                            std::int32_t ignore_index, float z_loss, float* lse, std::int64_t* count);
// The fused form over a block holding the whole vocabulary: logits -> gradient in place;
// returns the summed loss over non-ignored rows and their count (waits for s).
double cross_entropy_fused_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, const std::int32_t* targets, std::int32_t ignore_index, float z_loss,
                                float scale, std::int64_t* count);

}  // namespace peakbound::ops
