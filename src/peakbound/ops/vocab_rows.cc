#include "peakbound/ops/vocab_rows.h"

#include "peakbound/kernels/cpu/vocab_rows.h"
#include "peakbound/kernels/cuda/cross_entropy.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void vocab_row_max(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                   std::int64_t ld, float* row_max) {
  dispatch(dev, s, "vocab_row_max", {logits, row_max},
           [&](void* stream) { cuda::row_max(stream, logits, rows, cols, ld, row_max); },
           [=] { cpu::row_max(logits, rows, cols, ld, row_max); });
}

void vocab_row_sum_exp(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                       std::int64_t ld, const float* row_max, float* row_sum) {
  dispatch(dev, s, "vocab_row_sum_exp", {logits, row_max, row_sum},
           [&](void* stream) { cuda::row_sum_exp(stream, logits, rows, cols, ld, row_max, row_sum); },
           [=] { cpu::row_sum_exp(logits, rows, cols, ld, row_max, row_sum); });
}

void vocab_lse_finalize(Device& dev, Stream& s, float* max_to_lse, const float* row_sum, std::int64_t rows) {
  dispatch(dev, s, "vocab_lse_finalize", {max_to_lse, row_sum},
           [&](void* stream) { cuda::lse_finalize(stream, max_to_lse, row_sum, rows); },
           [=] { cpu::lse_finalize(max_to_lse, row_sum, rows); });
}

}  // namespace peakbound::ops
