#include "peakbound/kernels/cpu/cross_entropy.h"

#include <cmath>
#include <limits>

#include "peakbound/kernels/cpu/vexp.h"

namespace peakbound::cpu {

void lse_update(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                float* run_max, float* run_sum) {
  if (cols == 0) return;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * ld;
    const float m = row_max(l, cols);
    float new_max = m > run_max[r] ? m : run_max[r];
    const float s = sum_exp_shift(l, cols, new_max);
    // exp(-inf) = 0 keeps the first block's rescale harmless.
    run_sum[r] = run_sum[r] * exp_f32(run_max[r] - new_max) + s;
    run_max[r] = new_max;
  }
}

void gather_target_logit(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t j = static_cast<std::int64_t>(targets[r]) - vocab_offset;
    if (j >= 0 && j < cols) target_logit[r] += logits[r * ld + j];
  }
}

void cross_entropy_grad(float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                        std::int32_t ignore_index, float z_loss, float scale) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * ld;
    if (targets[r] == ignore_index) {
      for (std::int64_t j = 0; j < cols; ++j) l[j] = 0.0f;
      continue;
    }
    const float a = scale * (1.0f + 2.0f * z_loss * lse[r]);
    exp_shift(l, cols, lse[r]);
    for (std::int64_t j = 0; j < cols; ++j) l[j] = a * l[j];
    std::int64_t t = static_cast<std::int64_t>(targets[r]) - vocab_offset;
    if (t >= 0 && t < cols) l[t] -= scale;
  }
}

double cross_entropy_finish(const float* run_max, const float* run_sum, const float* target_logit,
                            const std::int32_t* targets, std::int64_t rows, std::int32_t ignore_index,
                            float z_loss, float* lse, std::int64_t* count) {
  double loss = 0;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    lse[r] = run_max[r] + std::log(run_sum[r]);
    if (targets[r] == ignore_index) continue;
    loss += static_cast<double>(lse[r]) - target_logit[r] + static_cast<double>(z_loss) * lse[r] * lse[r];
    ++n;
  }
  *count = n;
  return loss;
}

double cross_entropy_fused_grad(float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                const std::int32_t* targets, std::int32_t ignore_index, float z_loss, float scale,
                                std::int64_t* count) {
  double loss = 0;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * ld;
    const std::int32_t t = targets[r];
    if (t == ignore_index || cols == 0) {
      for (std::int64_t j = 0; j < cols; ++j) l[j] = 0.0f;
      continue;
    }
    const float m = row_max(l, cols);
    const float target_logit = l[t];
    const float s = exp_shift_sum(l, cols, m);
    const float lse = m + std::log(s);
    loss += static_cast<double>(lse) - target_logit + static_cast<double>(z_loss) * lse * lse;
    ++n;
    // softmax = e / s; gradient = scale (1 + 2 z lse) softmax - scale onehot.
    const float a = scale * (1.0f + 2.0f * z_loss * lse) / s;
    for (std::int64_t j = 0; j < cols; ++j) l[j] *= a;
    l[t] -= scale;
  }
  *count = n;
  return loss;
}

}  // namespace peakbound::cpu

namespace peakbound::cpu {

void lse_merge(float* max_a, float* sum_a, float* target_a, const float* max_b, const float* sum_b,
               const float* target_b, std::int64_t rows) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float m = max_a[r] > max_b[r] ? max_a[r] : max_b[r];
    if (m == -std::numeric_limits<float>::infinity()) continue;  // both empty
    sum_a[r] = sum_a[r] * exp_f32(max_a[r] - m) + sum_b[r] * exp_f32(max_b[r] - m);
    max_a[r] = m;
    target_a[r] += target_b[r];
  }
}

}  // namespace peakbound::cpu
