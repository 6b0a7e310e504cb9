#include "peakbound/kernels/cuda/cross_entropy.h"

#include <cmath>
#include <string>

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

// A block's maximum (blockDim.x == kThreads), returned to every thread.
__device__ float block_max(float v) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float m = part[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, part[w]);
  __syncthreads();
  return m;
}

__global__ void lse_update_k(const float* logits, std::int64_t cols, std::int64_t ld, float* run_max, float* run_sum) {
  const std::int64_t r = blockIdx.x;
  const float* l = logits + r * ld;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, l[j]);
  m = block_max(m);
  const float new_max = m > run_max[r] ? m : run_max[r];
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(l[j] - new_max);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    run_sum[r] = run_sum[r] * expf(run_max[r] - new_max) + static_cast<float>(s);
    run_max[r] = new_max;
  }
}

__global__ void gather_target_logit_k(const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                      const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit) {
  for (std::int64_t r = first_index(); r < rows; r += grid_stride()) {
    const std::int64_t j = static_cast<std::int64_t>(targets[r]) - vocab_offset;
    if (j >= 0 && j < cols) target_logit[r] += logits[r * ld + j];
  }
}

__global__ void cross_entropy_grad_k(float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                     const float* lse, const std::int32_t* targets, std::int64_t vocab_offset,
                                     std::int32_t ignore_index, float z_loss, float scale) {
  for (std::int64_t e = first_index(); e < rows * cols; e += grid_stride()) {
    const std::int64_t r = e / cols, j = e % cols;
    float* l = logits + r * ld + j;
    if (targets[r] == ignore_index) {
      *l = 0.0f;
      continue;
    }
    const float a = scale * (1.0f + 2.0f * z_loss * lse[r]);
    float g = a * expf(*l - lse[r]);
    if (static_cast<std::int64_t>(targets[r]) - vocab_offset == j) g -= scale;
    *l = g;
  }
}

__global__ void lse_merge_k(float* max_a, float* sum_a, float* target_a, const float* max_b, const float* sum_b,
                            const float* target_b, std::int64_t rows) {
  for (std::int64_t r = first_index(); r < rows; r += grid_stride()) {
    const float m = max_a[r] > max_b[r] ? max_a[r] : max_b[r];
    if (m == -INFINITY) continue;  // both empty
    sum_a[r] = sum_a[r] * expf(max_a[r] - m) + sum_b[r] * expf(max_b[r] - m);
    max_a[r] = m;
    target_a[r] += target_b[r];
  }
}

// One block: lse per row, then the loss and count summed in double.
__global__ void cross_entropy_finish_k(const float* run_max, const float* run_sum, const float* target_logit,
                                       const std::int32_t* targets, std::int64_t rows, std::int32_t ignore_index,
                                       float z_loss, float* lse, double* result) {
  double loss = 0, n = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float v = run_max[r] + logf(run_sum[r]);
    lse[r] = v;
    if (targets[r] == ignore_index) continue;
    loss += static_cast<double>(v) - target_logit[r] + static_cast<double>(z_loss) * v * v;
    n += 1;
  }
  loss = block_sum(loss);
  n = block_sum(n);
  if (threadIdx.x == 0) {
    result[0] = loss;
    result[1] = n;
  }
}

__global__ void fused_grad_k(float* logits, std::int64_t cols, std::int64_t ld, const std::int32_t* targets,
                             std::int32_t ignore_index, float z_loss, float scale, double* result) {
  const std::int64_t r = blockIdx.x;
  float* l = logits + r * ld;
  const std::int32_t t = targets[r];
  if (t == ignore_index || cols == 0) {
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) l[j] = 0.0f;
    if (threadIdx.x == 0) result[r] = 0.0, result[kFusedRowsPerLaunch + r] = 0.0;
    return;
  }
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, l[j]);
  m = block_max(m);
  const float target_logit = l[t];
  __syncthreads();  // every thread has read l[t] before it is overwritten
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = expf(l[j] - m);
    l[j] = e;
    s += e;
  }
  const float sf = static_cast<float>(block_sum(s));
  const float lse = m + logf(sf);
  const float a = scale * (1.0f + 2.0f * z_loss * lse) / sf;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) l[j] = l[j] * a - (j == t ? scale : 0.0f);
  if (threadIdx.x == 0) {
    result[r] = static_cast<double>(lse) - target_logit + static_cast<double>(z_loss) * lse * lse;
    result[kFusedRowsPerLaunch + r] = 1.0;
  }
}

__global__ void row_max_k(const float* logits, std::int64_t cols, std::int64_t ld, float* out) {
  const std::int64_t r = blockIdx.x;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, logits[r * ld + j]);
  m = block_max(m);
  if (threadIdx.x == 0) out[r] = m;
}

__global__ void row_sum_exp_k(const float* logits, std::int64_t cols, std::int64_t ld, const float* row_max,
                              float* row_sum) {
  const std::int64_t r = blockIdx.x;
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(logits[r * ld + j] - row_max[r]);
  s = block_sum(s);
  if (threadIdx.x == 0) row_sum[r] = static_cast<float>(s);
}

__global__ void lse_finalize_k(float* max_to_lse, const float* row_sum, std::int64_t rows) {
  for (std::int64_t r = first_index(); r < rows; r += grid_stride()) max_to_lse[r] = max_to_lse[r] + logf(row_sum[r]);
}

}  // namespace

void lse_update(void* s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* run_max,
                float* run_sum) {
  if (rows <= 0 || cols <= 0) return;
  lse_update_k<<<row_blocks(rows, "lse_update"), kThreads, 0, native(s)>>>(logits, cols, ld, run_max, run_sum);
  check_launch("lse_update");
}

void gather_target_logit(void* s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         const std::int32_t* targets, std::int64_t vocab_offset, float* target_logit) {
  if (rows <= 0 || cols <= 0) return;
  gather_target_logit_k<<<blocks_for(rows), kThreads, 0, native(s)>>>(logits, rows, cols, ld, targets, vocab_offset,
                                                                       target_logit);
  check_launch("gather_target_logit");
}

void cross_entropy_grad(void* s, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, const float* lse,
                        const std::int32_t* targets, std::int64_t vocab_offset, std::int32_t ignore_index, float z_loss,
                        float scale) {
  if (rows <= 0 || cols <= 0) return;
  cross_entropy_grad_k<<<blocks_for(rows * cols), kThreads, 0, native(s)>>>(logits, rows, cols, ld, lse, targets,
                                                                             vocab_offset, ignore_index, z_loss, scale);
  check_launch("cross_entropy_grad");
}

void lse_merge(void* s, float* max_a, float* sum_a, float* target_a, const float* max_b, const float* sum_b,
               const float* target_b, std::int64_t rows) {
  if (rows <= 0) return;
  lse_merge_k<<<blocks_for(rows), kThreads, 0, native(s)>>>(max_a, sum_a, target_a, max_b, sum_b, target_b, rows);
  check_launch("lse_merge");
}

void cross_entropy_finish(void* s, const float* run_max, const float* run_sum, const float* target_logit,
                          const std::int32_t* targets, std::int64_t rows, std::int32_t ignore_index, float z_loss,
                          float* lse, double* result) {
  cross_entropy_finish_k<<<1, kThreads, 0, native(s)>>>(run_max, run_sum, target_logit, targets, rows, ignore_index,
                                                        z_loss, lse, result);
  check_launch("cross_entropy_finish");
}

void cross_entropy_fused_grad(void* s, float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                              const std::int32_t* targets, std::int32_t ignore_index, float z_loss, float scale,
                              double* result) {
  if (rows <= 0) return;
  if (rows > kFusedRowsPerLaunch)
    throw InvalidArgument("cuda cross_entropy_fused_grad: " + std::to_string(rows) + " rows in one launch, at most " +
                          std::to_string(kFusedRowsPerLaunch));
  fused_grad_k<<<static_cast<unsigned>(rows), kThreads, 0, native(s)>>>(logits, cols, ld, targets, ignore_index, z_loss,
                                                                       scale, result);
  check_launch("cross_entropy_fused_grad");
}

void row_max(void* s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* out) {
  if (rows <= 0) return;
  row_max_k<<<row_blocks(rows, "row_max"), kThreads, 0, native(s)>>>(logits, cols, ld, out);
  check_launch("row_max");
}

void row_sum_exp(void* s, const float* logits, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                 const float* row_max_v, float* row_sum) {
  if (rows <= 0) return;
  row_sum_exp_k<<<row_blocks(rows, "row_sum_exp"), kThreads, 0, native(s)>>>(logits, cols, ld, row_max_v, row_sum);
  check_launch("row_sum_exp");
}

void lse_finalize(void* s, float* max_to_lse, const float* row_sum, std::int64_t rows) {
  if (rows <= 0) return;
  lse_finalize_k<<<blocks_for(rows), kThreads, 0, native(s)>>>(max_to_lse, row_sum, rows);
  check_launch("lse_finalize");
}

}  // namespace peakbound::cuda
