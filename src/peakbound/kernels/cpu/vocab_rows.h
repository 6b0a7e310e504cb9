// Row statistics of a logits block [rows, cols] (row stride ld) that the materialized
// vocab-parallel cross-entropy needs around its all-reduces (Ring-DTP folds the same
// statistics online with lse_update instead).
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// Writes row_max[r] = max_j logits[r, j] (-inf for cols == 0).
void row_max(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* row_max);

// Writes row_sum[r] = sum_j exp(logits[r, j] - row_max[r]).
void row_sum_exp(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, const float* row_max,
                 float* row_sum);

// In place: max_to_lse[r] = max_to_lse[r] + log(row_sum[r]) (the row's log-sum-exp).
void lse_finalize(float* max_to_lse, const float* row_sum, std::int64_t rows);

}  // namespace peakbound::cpu
