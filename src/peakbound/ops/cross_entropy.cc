#include "peakbound/ops/cross_entropy.h"

#include <algorithm>

#include "peakbound/kernels/cpu/cross_entropy.h"
#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cuda/cross_entropy.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void lse_update(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum) {
  check_device_pointers(dev, "lse_update", {logits, run_max, run_sum});
  PB_ON_CUDA(dev, s, cuda::lse_update(stream, logits, rows, cols, ld, run_max, run_sum))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "lse_update");
  cpu::launch(s, [=] { cpu::lse_update(logits, rows, cols, ld, run_max, run_sum); });
}

void gather_target_logit(Device& dev, Stream& s, const float* logits, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld, const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit) {
  check_device_pointers(dev, "gather_target_logit", {logits, targets, target_logit});
  PB_ON_CUDA(dev, s, cuda::gather_target_logit(stream, logits, rows, cols, ld, targets, vocab_offset, target_logit))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "gather_target_logit");
  cpu::launch(s, [=] { cpu::gather_target_logit(logits, rows, cols, ld, targets, vocab_offset, target_logit); });
}

void cross_entropy_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale) {
  check_device_pointers(dev, "cross_entropy_grad", {logits, lse, targets});
  PB_ON_CUDA(dev, s, cuda::cross_entropy_grad(stream, logits, rows, cols, ld, lse, targets, vocab_offset, ignore_index, z_loss, scale))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "cross_entropy_grad");
  cpu::launch(s, [=] {
    cpu::cross_entropy_grad(logits, rows, cols, ld, lse, targets, vocab_offset, ignore_index, z_loss, scale);
  });
}

void lse_merge(Device& dev, Stream& s, float* max_a, float* sum_a, float* target_a, const float* max_b,
               const float* sum_b, const float* target_b, std::int64_t rows) {
  check_device_pointers(dev, "lse_merge", {max_a, sum_a, target_a, max_b, sum_b, target_b});
  PB_ON_CUDA(dev, s, cuda::lse_merge(stream, max_a, sum_a, target_a, max_b, sum_b, target_b, rows))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "lse_merge");
  cpu::launch(s, [=] { cpu::lse_merge(max_a, sum_a, target_a, max_b, sum_b, target_b, rows); });
}

double cross_entropy_finish(Device& dev, Stream& s, const float* run_max, const float* run_sum,
                            const float* target_logit, const std::int32_t* targets, std::int64_t rows,
                            std::int32_t ignore_index, float z_loss, float* lse, std::int64_t* count) {
  check_device_pointers(dev, "cross_entropy_finish", {run_max, run_sum, target_logit, targets, lse});  // count: host
#ifdef PEAKBOUND_HAVE_CUDA
  if (dev.backend() == Backend::cuda) {
    // The sums land in the device's mapped result slot once the stream reaches them.
    double* slot = cuda_result_slot(dev);
    cuda::cross_entropy_finish(cuda_stream(dev, s), run_max, run_sum, target_logit, targets, rows, ignore_index, z_loss,
                               lse, slot);
    dev.synchronize(s);
    *count = static_cast<std::int64_t>(slot[1]);
    return slot[0];
  }
#endif
  if (dev.backend() != Backend::cpu) no_kernel(dev, "cross_entropy_finish");
  double loss = 0;
  cpu::launch_and_wait(s, [&] {
    loss = cpu::cross_entropy_finish(run_max, run_sum, target_logit, targets, rows, ignore_index, z_loss, lse, count);
  });
  return loss;
}

double cross_entropy_fused_grad(Device& dev, Stream& s, float* logits, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, const std::int32_t* targets, std::int32_t ignore_index, float z_loss,
                                float scale, std::int64_t* count) {
  check_device_pointers(dev, "cross_entropy_fused_grad", {logits, targets});  // count: host
#ifdef PEAKBOUND_HAVE_CUDA
  if (dev.backend() == Backend::cuda) {
    // Row chunks that fit the device's result slot, summed here in row order.
    double* slot = cuda_result_slot(dev);
    double loss = 0;
    std::int64_t n = 0;
    for (std::int64_t r0 = 0; r0 < rows; r0 += cuda::kFusedRowsPerLaunch) {
      const std::int64_t m = std::min(cuda::kFusedRowsPerLaunch, rows - r0);
      cuda::cross_entropy_fused_grad(cuda_stream(dev, s), logits + r0 * ld, m, cols, ld, targets + r0, ignore_index,
                                     z_loss, scale, slot);
      dev.synchronize(s);
      for (std::int64_t r = 0; r < m; ++r) {
        loss += slot[r];
        n += static_cast<std::int64_t>(slot[cuda::kFusedRowsPerLaunch + r]);
      }
    }
    *count = n;
    return loss;
  }
#endif
  if (dev.backend() != Backend::cpu) no_kernel(dev, "cross_entropy_fused_grad");
  double loss = 0;
  cpu::launch_and_wait(s, [&] {
    loss = cpu::cross_entropy_fused_grad(logits, rows, cols, ld, targets, ignore_index, z_loss, scale, count);
  });
  return loss;
}

}  // namespace peakbound::ops
