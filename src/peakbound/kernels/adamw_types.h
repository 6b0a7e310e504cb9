// The AdamW step in backend-neutral terms: hyper-parameters, the learning-rate
// schedule, the per-step scalars every kernel uses, the description of one update's
// tensors, and the SIMD level a host CPU body runs at. No backend state: the device
// ops (ops/adamw.h), the host ops (ops/host_adamw.h), every backend's kernels
// (kernels/cpu/adamw.h, kernels/cuda/adamw.h) and the optimizer schedules share these,
// so they sit at the kernels' level, below ops (ops/adamw_types.h names them there).
//
// Per element, with the step's scalars s (adamw_step_scalars):
//   g  = grad * s.grad_scale                       (global-norm clipping)
//   m  = fma(1 - beta1, g, beta1 * m)
//   v  = fma((1 - beta2) * g, g, beta2 * v)
//   d  = fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)
//   w  = fma(-lr / (1 - beta1^t), m / d, w * (1 - lr * weight_decay))
//   param = w  (rounded to bf16 when the device holds bf16)
#pragma once

#include <cstdint>
#include <string_view>

#include "peakbound/core/dtype.h"

namespace peakbound {

// Hyper-parameters of AdamW. max_grad_norm <= 0 turns clipping off.
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float max_grad_norm = 1.0f;
};

// Linear warm-up then cosine decay to min_lr; warmup_steps = total_steps = 0 is a
// constant learning rate. Steps count from 1.
struct LrSchedule {
  float base_lr = 1e-3f;
  float min_lr = 0.0f;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;
  float lr(std::int64_t step) const;
};

// The per-step scalars, computed once (in double, rounded once to float) so that
// every body and every schedule uses the same values.
struct AdamWStepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float decay;          // 1 - lr * weight_decay
  float neg_step_size;  // -lr / (1 - beta1^t)
  float inv_sqrt_bc2;   // 1 / sqrt(1 - beta2^t)
  float grad_scale;     // clipping factor, 1 when not clipped
};

// step >= 1; throws InvalidArgument for a step < 1 or hyper-parameters out of range.
AdamWStepScalars adamw_step_scalars(const AdamWConfig& c, std::int64_t step, float lr,
                                    float grad_scale);

// The tensors of one update: master, m, v [n] fp32 updated in place; grad [n] in
// grad_dtype read; param [n] in param_dtype written. Dtypes are f32 or bf16.
struct AdamWTensors {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  void* param = nullptr;
  DType param_dtype = DType::f32;
  std::int64_t n = 0;

  // Elements [offset, offset + count) of every tensor.
  AdamWTensors slice(std::int64_t offset, std::int64_t count) const;
};

// Elements per parallel task of the host CPU update (kernels/cpu/adamw.h). Long enough
// that each of the nine streams (three read-write fp32 arrays, a gradient, a
// parameter) keeps its prefetcher running between task switches, short enough that a
// thread the OS deschedules holds up little: 2^17 measured best on this machine
// (1.55-1.76 G params/s against 1.21-1.23 at 2^15 and 1.28-1.57 at 2^18, 64M bf16
// parameters, 2 threads). The update is elementwise, so the result does not depend on it.
inline constexpr std::int64_t kAdamWChunk = 1 << 17;

// Which body a host CPU kernel runs: the plain scalar reference, AVX2 or AVX-512
// (all bitwise equal). A knob of host compute; a backend with its own execution
// model ignores it.
enum class SimdLevel : std::uint8_t { scalar, avx2, avx512 };

std::string_view simd_level_name(SimdLevel l);
// "scalar", "avx2", "avx512"; throws InvalidArgument otherwise.
SimdLevel parse_simd_level(std::string_view name);
// Whether this CPU runs the level (__builtin_cpu_supports).
bool simd_level_supported(SimdLevel l);
// The widest level this CPU supports.
SimdLevel best_simd_level();

}  // namespace peakbound
