// Row statistics of a logits block for the materialized vocab-parallel cross-entropy,
// through the device's backend (math: kernels/cpu/vocab_rows.h). All buffers are device
// memory; row_max and row_sum are written, max_to_lse is updated in place.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void vocab_row_max(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                   std::int64_t ld, float* row_max);
void vocab_row_sum_exp(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                       std::int64_t ld, const float* row_max, float* row_sum);
void vocab_lse_finalize(Device& dev, Stream& s, float* max_to_lse, const float* row_sum, std::int64_t rows);

}  // namespace peakbound::ops
