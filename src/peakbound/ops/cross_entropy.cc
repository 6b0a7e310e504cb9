#include "peakbound/ops/cross_entropy.h"

#include <algorithm>

#include "peakbound/kernels/cpu/cross_entropy.h"
#include "peakbound/kernels/cuda/cross_entropy.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void lse_update(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum) {
  dispatch(dev, s, "lse_update", {logits, run_max, run_sum},
           [&](void* stream) { cuda::lse_update(stream, logits, rows, cols, ld, run_max, run_sum); },
           [=] { cpu::lse_update(logits, rows, cols, ld, run_max, run_sum); });
}

void gather_target_logit(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld, const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit) {
  dispatch(dev, s, "gather_target_logit", {logits, targets, target_logit},
           [&](void* stream) {
             cuda::gather_target_logit(stream, logits, rows, cols, ld, targets, vocab_offset, target_logit);
           },
           [=] { cpu::gather_target_logit(logits, rows, cols, ld, targets, vocab_offset, target_logit); });
}

void cross_entropy_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale) {
  dispatch(dev, s, "cross_entropy_grad", {logits, lse, targets},
           [&](void* stream) {
             cuda::cross_entropy_grad(stream, logits, rows, cols, ld, lse, targets, vocab_offset, ignore_index, z_loss,
                                      scale);
           },
           [=] {
             cpu::cross_entropy_grad(logits, rows, cols, ld, lse, targets, vocab_offset, ignore_index, z_loss, scale);
           });
}

void lse_merge(Device& dev, Stream& s, float* max_a, float* sum_a, float* target_a, const float* max_b,
               const float* sum_b, const float* target_b, std::int64_t rows) {
  dispatch(dev, s, "lse_merge", {max_a, sum_a, target_a, max_b, sum_b, target_b},
           [&](void* stream) { cuda::lse_merge(stream, max_a, sum_a, target_a, max_b, sum_b, target_b, rows); },
           [=] { cpu::lse_merge(max_a, sum_a, target_a, max_b, sum_b, target_b, rows); });
}

double cross_entropy_finish(Device& dev, Stream& s, const float* run_max, const float* run_sum,
                            const float* target_logit, const std::int32_t* targets, std::int64_t rows,
                            std::int32_t ignore_index, float z_loss, float* lse, std::int64_t* count) {
  return dispatch_result<double>(
      dev, s, "cross_entropy_finish", {run_max, run_sum, target_logit, targets, lse},  // count: host
      [&](void* stream) {
        // The sums land in the device's mapped result slot once the stream reaches them.
        double* slot = cuda_result_slot(dev);
        cuda::cross_entropy_finish(stream, run_max, run_sum, target_logit, targets, rows, ignore_index, z_loss, lse,
                                   slot);
        dev.synchronize(s);
        *count = static_cast<std::int64_t>(slot[1]);
        return slot[0];
      },
      [&] {
        return cpu::cross_entropy_finish(run_max, run_sum, target_logit, targets, rows, ignore_index, z_loss, lse,
                                         count);
      });
}

double cross_entropy_fused_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, const std::int32_t* targets, std::int32_t ignore_index, float z_loss,
                                float scale, std::int64_t* count) {
  return dispatch_result<double>(
      dev, s, "cross_entropy_fused_grad", {logits, targets},  // count: host
      [&](void* stream) {
        // Row chunks that fit the device's result slot, summed here in row order.
        double* slot = cuda_result_slot(dev);
        double loss = 0;
        std::int64_t n = 0;
        for (std::int64_t r0 = 0; r0 < rows; r0 += cuda::kFusedRowsPerLaunch) {
          const std::int64_t m = std::min(cuda::kFusedRowsPerLaunch, rows - r0);
          cuda::cross_entropy_fused_grad(stream, logits + r0 * ld, m, cols, ld, targets + r0, ignore_index, z_loss,
                                         scale, slot);
          dev.synchronize(s);
          for (std::int64_t r = 0; r < m; ++r) {
            loss += slot[r];
            n += static_cast<std::int64_t>(slot[cuda::kFusedRowsPerLaunch + r]);
          }
        }
        *count = n;
        return loss;
      },
      [&] {
        return cpu::cross_entropy_fused_grad(logits, rows, cols, ld, targets, ignore_index, z_loss, scale, count);
      });
}

}  // namespace peakbound::ops
