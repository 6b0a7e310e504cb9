#include "peakbound/kernels/cuda/adamw.h"

#include <string>

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

__device__ inline float load(const float* p, std::int64_t i) { return p[i]; }
__device__ inline float load(const std::uint16_t* p, std::int64_t i) {
  return __uint_as_float(static_cast<std::uint32_t>(p[i]) << 16);
}
__device__ inline void store(float* p, std::int64_t i, float w) { p[i] = w; }
// Round to nearest even, NaN kept quiet: core/dtype.h's to_bf16, bit for bit.
__device__ inline void store(std::uint16_t* p, std::int64_t i, float w) {
  std::uint32_t u = __float_as_uint(w);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    p[i] = static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  p[i] = static_cast<std::uint16_t>(u >> 16);
}

template <typename G, typename P>
__global__ void adamw_k(AdamWStepScalars s, float* master, float* m_, float* v_, const G* grad, P* param,
                        std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = load(grad, i) * s.grad_scale;
    const float m = fmaf(s.one_minus_beta1, g, s.beta1 * m_[i]);
    const float v = fmaf(s.one_minus_beta2 * g, g, s.beta2 * v_[i]);
    const float d = fmaf(sqrtf(v), s.inv_sqrt_bc2, s.eps);
    const float w = fmaf(s.neg_step_size, m / d, master[i] * s.decay);
    m_[i] = m;
    v_[i] = v;
    master[i] = w;
    store(param, i, w);
  }
}

template <typename X>
__global__ void squares_k(const X* x, std::int64_t n, double* partial) {
  double acc = 0;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const double xi = load(x, i);
    acc = fma(xi, xi, acc);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials_k(const double* partial, int count, double* result) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) result[0] = acc;
}

void check_dtype(DType t, const char* what) {
  if (t != DType::f32 && t != DType::bf16)
    throw InvalidArgument(std::string("cuda adamw: ") + what + " dtype must be f32 or bf16");
}

}  // namespace

void adamw_update(void* s, const AdamWStepScalars& sc, const AdamWTensors& t) {
  check_dtype(t.grad_dtype, "gradient");
  check_dtype(t.param_dtype, "parameter");
  if (t.n <= 0) return;
  const unsigned b = blocks_for(t.n);
  const bool gb = t.grad_dtype == DType::bf16, pb = t.param_dtype == DType::bf16;
  auto* g16 = static_cast<const std::uint16_t*>(t.grad);
  auto* g32 = static_cast<const float*>(t.grad);
  auto* p16 = static_cast<std::uint16_t*>(t.param);
  auto* p32 = static_cast<float*>(t.param);
  if (gb && pb) adamw_k<<<b, kThreads, 0, native(s)>>>(sc, t.master, t.m, t.v, g16, p16, t.n);
  else if (gb) adamw_k<<<b, kThreads, 0, native(s)>>>(sc, t.master, t.m, t.v, g16, p32, t.n);
  else if (pb) adamw_k<<<b, kThreads, 0, native(s)>>>(sc, t.master, t.m, t.v, g32, p16, t.n);
  else adamw_k<<<b, kThreads, 0, native(s)>>>(sc, t.master, t.m, t.v, g32, p32, t.n);
  check_launch("adamw_update");
}

void sum_squares(void* s, const void* x, DType dtype, std::int64_t n, double* result) {
  check_dtype(dtype, "sum_squares");
  // One partial per block, in the result memory after the first slot (no device
  // scratch outside the Arena): enough blocks to keep every SM streaming.
  constexpr int kBlocks = 256;
  double* partial = result + 1;
  if (dtype == DType::bf16) squares_k<<<kBlocks, kThreads, 0, native(s)>>>(static_cast<const std::uint16_t*>(x), n, partial);
  else squares_k<<<kBlocks, kThreads, 0, native(s)>>>(static_cast<const float*>(x), n, partial);
  check_launch("sum_squares");
  sum_partials_k<<<1, kThreads, 0, native(s)>>>(partial, kBlocks, result);
  check_launch("sum_squares");
}

}  // namespace peakbound::cuda
