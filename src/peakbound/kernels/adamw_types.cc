#include "peakbound/kernels/adamw_types.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

float LrSchedule::lr(std::int64_t step) const {
  if (step < 1) throw InvalidArgument("lr schedule: steps count from 1, got " + std::to_string(step));
  if (warmup_steps > 0 && step <= warmup_steps)
    return static_cast<float>(static_cast<double>(base_lr) * static_cast<double>(step) /
                              static_cast<double>(warmup_steps));
  if (total_steps <= warmup_steps) return base_lr;
  double progress = static_cast<double>(std::min(step, total_steps) - warmup_steps) /
                    static_cast<double>(total_steps - warmup_steps);
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (static_cast<double>(base_lr) - min_lr) * cosine);
}

AdamWStepScalars adamw_step_scalars(const AdamWConfig& c, std::int64_t step, float lr,
                                    float grad_scale) {
  if (step < 1) throw InvalidArgument("adamw: steps count from 1, got " + std::to_string(step));
  auto in_unit = [](float b) { return b >= 0.0f && b < 1.0f; };
  if (!in_unit(c.beta1) || !in_unit(c.beta2))
    throw InvalidArgument("adamw: beta1 and beta2 must lie in [0, 1)");
  if (!(c.eps > 0.0f)) throw InvalidArgument("adamw: eps must be positive");
  if (!(lr >= 0.0f) || !(c.weight_decay >= 0.0f))
    throw InvalidArgument("adamw: lr and weight decay must be non-negative");
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
  AdamWStepScalars s{};
  s.beta1 = c.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  s.beta2 = c.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.eps = c.eps;
  s.decay = static_cast<float>(1.0 - static_cast<double>(lr) * c.weight_decay);
  s.neg_step_size = static_cast<float>(-static_cast<double>(lr) / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.grad_scale = grad_scale;
  return s;
}

AdamWTensors AdamWTensors::slice(std::int64_t offset, std::int64_t count) const {
  PB_CHECK(offset >= 0 && count >= 0 && offset + count <= n);
  auto at = [](const void* p, DType t, std::int64_t i) {
    return static_cast<const char*>(p) + static_cast<std::int64_t>(dtype_size(t)) * i;
  };
  AdamWTensors t = *this;
  t.master += offset;
  t.m += offset;
  t.v += offset;
  t.grad = at(grad, grad_dtype, offset);
  t.param = const_cast<char*>(at(param, param_dtype, offset));
  t.n = count;
  return t;
}

std::string_view simd_level_name(SimdLevel l) {
  switch (l) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
  }
  return "?";
}

SimdLevel parse_simd_level(std::string_view name) {
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512})
    if (name == simd_level_name(l)) return l;
  throw InvalidArgument("unknown SIMD level '" + std::string(name) + "' (use scalar, avx2, avx512)");
}

bool simd_level_supported(SimdLevel l) {
  switch (l) {
    case SimdLevel::scalar: return true;
    case SimdLevel::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdLevel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

SimdLevel best_simd_level() {
  if (simd_level_supported(SimdLevel::avx512)) return SimdLevel::avx512;
  if (simd_level_supported(SimdLevel::avx2)) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

}  // namespace peakbound
