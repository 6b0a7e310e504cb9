#include "peakbound/kernels/cuda/elementwise.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

// Element access over f32 and bf16 storage, as widen/narrow in core/dtype.h: widening is
// exact; narrowing is to_bf16's integer arithmetic (round to nearest even, a NaN keeps
// its sign and top bits with the quiet bit set), so both backends round alike.
__device__ inline float dwiden(float x) { return x; }
__device__ inline float dwiden(bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
template <typename T> __device__ T dnarrow(float x);
template <> __device__ inline float dnarrow<float>(float x) { return x; }
template <> __device__ inline bf16 dnarrow<bf16>(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

// Written once over the storage type T; with T = float each is the f32 kernel's
// expression as it was, so the f32 bits (fused multiply-adds included) do not change.
template <typename T>
__global__ void fill_k(T* x, std::int64_t n, float v) {
  const T t = dnarrow<T>(v);
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) x[i] = t;
}
__global__ void scale_k(float* x, std::int64_t n, float a) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= a;
}
template <typename T>
__global__ void axpy_k(T* y, const T* x, std::int64_t n, float a) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = dnarrow<T>(dwiden(y[i]) + a * dwiden(x[i]));
}
template <typename T>
__global__ void add_k(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) out[i] = dnarrow<T>(dwiden(a[i]) + dwiden(b[i]));
}
template <typename O, typename I>
__global__ void convert_k(O* out, const I* in, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) out[i] = dnarrow<O>(dwiden(in[i]));
}

template <typename T>
__global__ void swiglu_forward_k(T* out, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = dwiden(gate[i]);
    out[i] = dnarrow<T>(g * sigmoid(g) * dwiden(up[i]));
  }
}
template <typename T>
__global__ void swiglu_backward_k(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = dwiden(gate[i]), u = dwiden(up[i]), d = dwiden(dout[i]);
    const float s = sigmoid(g);
    dgate[i] = dnarrow<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = dnarrow<T>(d * g * s);
  }
}

// One block per row.
template <typename T>
__global__ void rmsnorm_forward_k(T* out, float* rstd, const T* x, const T* weight, std::int64_t c, float eps) {
  const std::int64_t row = blockIdx.x;
  const T* xi = x + row * c;
  T* oi = out + row * c;
  double ss = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) ss += static_cast<double>(dwiden(xi[j])) * dwiden(xi[j]);
  ss = block_sum(ss);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(c) + eps));
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) oi[j] = dnarrow<T>(dwiden(xi[j]) * r * dwiden(weight[j]));
  if (rstd && threadIdx.x == 0) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_backward_dx_k(T* dx, const T* dout, const T* x, const T* weight, const float* rstd,
                                      std::int64_t c) {
  const std::int64_t row = blockIdx.x;
  const T* xi = x + row * c;
  const T* gi = dout + row * c;
  T* dxi = dx + row * c;
  const float r = rstd[row];
  double dot = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x)
    dot += static_cast<double>(dwiden(weight[j])) * dwiden(gi[j]) * (dwiden(xi[j]) * r);
  dot = block_sum(dot);
  const float mean = static_cast<float>(dot / static_cast<double>(c));
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x)
    dxi[j] = dnarrow<T>(dwiden(dxi[j]) + r * (dwiden(weight[j]) * dwiden(gi[j]) - dwiden(xi[j]) * r * mean));
}

// One thread per column, rows in order (coalesced across the columns of a warp). dweight
// is fp32 for both storage types (a parameter gradient).
template <typename T>
__global__ void rmsnorm_backward_dw_k(float* dweight, const T* dout, const T* x, const float* rstd, std::int64_t n,
                                      std::int64_t c) {
  for (std::int64_t j = first_index(); j < c; j += grid_stride()) {
    float acc = dweight[j];
    for (std::int64_t i = 0; i < n; ++i) acc += dwiden(dout[i * c + j]) * (dwiden(x[i * c + j]) * rstd[i]);
    dweight[j] = acc;
  }
}

template <typename T>
void fill_t(void* s, T* x, std::int64_t n, float v) {
  if (n <= 0) return;
  fill_k<<<blocks_for(n), kThreads, 0, native(s)>>>(x, n, v);
  check_launch("fill");
}
template <typename T>
void axpy_t(void* s, T* y, const T* x, std::int64_t n, float a) {
  if (n <= 0) return;
  axpy_k<<<blocks_for(n), kThreads, 0, native(s)>>>(y, x, n, a);
  check_launch("axpy");
}
template <typename T>
void add_t(void* s, T* out, const T* a, const T* b, std::int64_t n) {
  if (n <= 0) return;
  add_k<<<blocks_for(n), kThreads, 0, native(s)>>>(out, a, b, n);
  check_launch("add");
}
template <typename O, typename I>
void convert_t(void* s, O* out, const I* in, std::int64_t n) {
  if (n <= 0) return;
  convert_k<<<blocks_for(n), kThreads, 0, native(s)>>>(out, in, n);
  check_launch("convert");
}
template <typename T>
void swiglu_forward_t(void* s, T* out, const T* gate, const T* up, std::int64_t n) {
  if (n <= 0) return;
  swiglu_forward_k<<<blocks_for(n), kThreads, 0, native(s)>>>(out, gate, up, n);
  check_launch("swiglu_forward");
}
template <typename T>
void swiglu_backward_t(void* s, T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  if (n <= 0) return;
  swiglu_backward_k<<<blocks_for(n), kThreads, 0, native(s)>>>(dgate, dup, dout, gate, up, n);
  check_launch("swiglu_backward");
}
template <typename T>
void rmsnorm_forward_t(void* s, T* out, float* rstd, const T* x, const T* weight, std::int64_t n, std::int64_t c,
                       float eps) {
  if (n <= 0 || c <= 0) return;
  rmsnorm_forward_k<<<row_blocks(n, "rmsnorm"), kThreads, 0, native(s)>>>(out, rstd, x, weight, c, eps);
  check_launch("rmsnorm_forward");
}
template <typename T>
void rmsnorm_backward_t(void* s, T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd,
                        std::int64_t n, std::int64_t c) {
  if (n <= 0 || c <= 0) return;
  rmsnorm_backward_dx_k<<<row_blocks(n, "rmsnorm"), kThreads, 0, native(s)>>>(dx, dout, x, weight, rstd, c);
  check_launch("rmsnorm_backward");
  rmsnorm_backward_dw_k<<<blocks_for(c), kThreads, 0, native(s)>>>(dweight, dout, x, rstd, n, c);
  check_launch("rmsnorm_backward");
}

}  // namespace

void fill(void* s, float* x, std::int64_t n, float v) { fill_t(s, x, n, v); }
void fill(void* s, bf16* x, std::int64_t n, float v) { fill_t(s, x, n, v); }
void scale(void* s, float* x, std::int64_t n, float a) {
  if (n <= 0) return;
  scale_k<<<blocks_for(n), kThreads, 0, native(s)>>>(x, n, a);
  check_launch("scale");
}
void axpy(void* s, float* y, const float* x, std::int64_t n, float a) { axpy_t(s, y, x, n, a); }
void axpy(void* s, bf16* y, const bf16* x, std::int64_t n, float a) { axpy_t(s, y, x, n, a); }
void add(void* s, float* out, const float* a, const float* b, std::int64_t n) { add_t(s, out, a, b, n); }
void add(void* s, bf16* out, const bf16* a, const bf16* b, std::int64_t n) { add_t(s, out, a, b, n); }
void convert(void* s, bf16* out, const float* in, std::int64_t n) { convert_t(s, out, in, n); }
void convert(void* s, float* out, const bf16* in, std::int64_t n) { convert_t(s, out, in, n); }

void swiglu_forward(void* s, float* out, const float* gate, const float* up, std::int64_t n) {
  swiglu_forward_t(s, out, gate, up, n);
}
void swiglu_forward(void* s, bf16* out, const bf16* gate, const bf16* up, std::int64_t n) {
  swiglu_forward_t(s, out, gate, up, n);
}
void swiglu_backward(void* s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::int64_t n) {
  swiglu_backward_t(s, dgate, dup, dout, gate, up, n);
}
void swiglu_backward(void* s, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                     std::int64_t n) {
  swiglu_backward_t(s, dgate, dup, dout, gate, up, n);
}
void rmsnorm_forward(void* s, float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  rmsnorm_forward_t(s, out, rstd, x, weight, n, c, eps);
}
void rmsnorm_forward(void* s, bf16* out, float* rstd, const bf16* x, const bf16* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  rmsnorm_forward_t(s, out, rstd, x, weight, n, c, eps);
}
void rmsnorm_backward(void* s, float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(s, dx, dweight, dout, x, weight, rstd, n, c);
}
void rmsnorm_backward(void* s, bf16* dx, float* dweight, const bf16* dout, const bf16* x, const bf16* weight,
                      const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(s, dx, dweight, dout, x, weight, rstd, n, c);
}

}  // namespace peakbound::cuda
