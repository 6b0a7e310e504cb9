#include "peakbound/kernels/cpu/vocab_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace peakbound::cpu {

void row_max(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* row_max) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, logits[i * ld + j]);
    row_max[i] = m;
  }
}

void row_sum_exp(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, const float* row_max,
                 float* row_sum) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float s = 0.0f;
    for (std::int64_t j = 0; j < cols; ++j) s += std::exp(logits[i * ld + j] - row_max[i]);
    row_sum[i] = s;
  }
}

void lse_finalize(float* max_to_lse, const float* row_sum, std::int64_t rows) {
  for (std::int64_t i = 0; i < rows; ++i) max_to_lse[i] = max_to_lse[i] + std::log(row_sum[i]);
}

}  // namespace peakbound::cpu
