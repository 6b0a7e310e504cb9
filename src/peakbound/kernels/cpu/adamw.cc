#include "peakbound/kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/adamw_simd.h"

namespace peakbound::cpu {

namespace {

void check_dtype(DType t, const char* what) {
  if (t != DType::f32 && t != DType::bf16)
    throw InvalidArgument(std::string("adamw: ") + what + " dtype must be f32 or bf16, got " +
                          std::string(dtype_name(t)));
}

const char* byte_offset(const void* p, DType t, std::int64_t i) {
  return static_cast<const char*>(p) + static_cast<std::int64_t>(dtype_size(t)) * i;
}

}  // namespace

namespace simd {

namespace {

template <typename G, typename P>
void adamw_scalar_typed(const AdamWStepScalars& s, const AdamWTensors& t) {
  const G* grad = static_cast<const G*>(t.grad);
  P* param = static_cast<P*>(t.param);
  for (std::int64_t i = 0; i < t.n; ++i) {
    float gi;
    if constexpr (std::is_same_v<G, bf16>) gi = to_f32(grad[i]); else gi = grad[i];
    const float g = gi * s.grad_scale;
    const float m = std::fma(s.one_minus_beta1, g, s.beta1 * t.m[i]);
    const float v = std::fma(s.one_minus_beta2 * g, g, s.beta2 * t.v[i]);
    const float d = std::fma(std::sqrt(v), s.inv_sqrt_bc2, s.eps);
    const float w = std::fma(s.neg_step_size, m / d, t.master[i] * s.decay);
    t.m[i] = m;
    t.v[i] = v;
    t.master[i] = w;
    if constexpr (std::is_same_v<P, bf16>) param[i] = to_bf16(w); else param[i] = w;
  }
}

}  // namespace

void adamw_scalar(const AdamWStepScalars& s, const AdamWTensors& t) {
  const bool gb = t.grad_dtype == DType::bf16, pb = t.param_dtype == DType::bf16;
  if (gb && pb) adamw_scalar_typed<bf16, bf16>(s, t);
  else if (gb) adamw_scalar_typed<bf16, float>(s, t);
  else if (pb) adamw_scalar_typed<float, bf16>(s, t);
  else adamw_scalar_typed<float, float>(s, t);
}

void squares_scalar(const void* x, DType dtype, std::int64_t n, double* lanes) {
  for (std::int64_t j = 0; j < n; ++j) {
    const double xi = dtype == DType::bf16 ? to_f32(static_cast<const bf16*>(x)[j])
                                           : static_cast<const float*>(x)[j];
    double& lane = lanes[j % kSquaresLanes];
    lane = std::fma(xi, xi, lane);
  }
}

}  // namespace simd

void adamw_update_reference(const AdamWStepScalars& s, const AdamWTensors& t) {
  check_dtype(t.grad_dtype, "gradient");
  check_dtype(t.param_dtype, "parameter");
  simd::adamw_scalar(s, t);
}

bool adamw_streams_param(const AdamWTensors& t) {
  const auto per_element = static_cast<std::int64_t>(12 + dtype_size(t.grad_dtype) + dtype_size(t.param_dtype));
  return t.n >= kAdamWStreamBytes / per_element;
}

namespace {

void check_update(SimdLevel level, const AdamWTensors& t) {
  check_dtype(t.grad_dtype, "gradient");
  check_dtype(t.param_dtype, "parameter");
  if (!simd_level_supported(level))
    throw Unavailable("adamw: this CPU does not support " + std::string(simd_level_name(level)));
}

// Checked by the caller; `stream` as adamw_streams_param of the whole update.
void run_body(SimdLevel level, const AdamWStepScalars& s, const AdamWTensors& t, bool stream) {
  switch (level) {
    case SimdLevel::scalar: simd::adamw_scalar(s, t); break;
    case SimdLevel::avx2: simd::adamw_avx2(s, t, stream); break;
    case SimdLevel::avx512: simd::adamw_avx512(s, t, stream); break;
  }
}

}  // namespace

void adamw_update(SimdLevel level, const AdamWStepScalars& s, const AdamWTensors& t) {
  check_update(level, t);
  run_body(level, s, t, adamw_streams_param(t));
}

void adamw_update_parallel(ThreadPool& pool, SimdLevel level, const AdamWStepScalars& s,
                           const AdamWTensors& t) {
  check_update(level, t);
  const bool stream = adamw_streams_param(t);
  if (t.n <= kAdamWChunk) {
    run_body(level, s, t, stream);
    return;
  }
  const std::int64_t tasks = (t.n + kAdamWChunk - 1) / kAdamWChunk;
  pool.parallel_for(tasks, [&](std::int64_t i) {
    const std::int64_t begin = i * kAdamWChunk;
    run_body(level, s, t.slice(begin, std::min(kAdamWChunk, t.n - begin)), stream);
  });
}

namespace {

double combine_lanes(const double* l) {
  // Pairwise, in a fixed order.
  double a[kSquaresLanes];
  for (int i = 0; i < kSquaresLanes; ++i) a[i] = l[i];
  for (int width = kSquaresLanes / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) a[i] = a[2 * i] + a[2 * i + 1];
  return a[0];
}

double block_squares(SimdLevel level, const void* x, DType dtype, std::int64_t n) {
  double lanes[kSquaresLanes] = {};
  switch (level) {
    case SimdLevel::scalar: simd::squares_scalar(x, dtype, n, lanes); break;
    case SimdLevel::avx2: simd::squares_avx2(x, dtype, n, lanes); break;
    case SimdLevel::avx512: simd::squares_avx512(x, dtype, n, lanes); break;
  }
  return combine_lanes(lanes);
}

}  // namespace

double sum_squares_reference(const void* x, DType dtype, std::int64_t n) {
  check_dtype(dtype, "gradient");
  double total = 0;
  for (std::int64_t b = 0; b < n; b += kSquaresBlock)
    total += block_squares(SimdLevel::scalar, byte_offset(x, dtype, b), dtype,
                           std::min(kSquaresBlock, n - b));
  return total;
}

double sum_squares(ThreadPool& pool, SimdLevel level, const void* x, DType dtype, std::int64_t n) {
  check_dtype(dtype, "gradient");
  if (!simd_level_supported(level))
    throw Unavailable("sum_squares: this CPU does not support " + std::string(simd_level_name(level)));
  const std::int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> partial(static_cast<std::size_t>(blocks));
  pool.parallel_for(blocks, [&](std::int64_t b) {
    const std::int64_t begin = b * kSquaresBlock;
    partial[static_cast<std::size_t>(b)] =
        block_squares(level, byte_offset(x, dtype, begin), dtype, std::min(kSquaresBlock, n - begin));
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace peakbound::cpu
