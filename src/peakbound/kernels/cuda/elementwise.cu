#include "peakbound/kernels/cuda/elementwise.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

__global__ void fill_k(float* x, std::int64_t n, float v) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) x[i] = v;
}
__global__ void scale_k(float* x, std::int64_t n, float a) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= a;
}
__global__ void axpy_k(float* y, const float* x, std::int64_t n, float a) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] += a * x[i];
}
__global__ void add_k(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void swiglu_forward_k(float* out, const float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}
__global__ void swiglu_backward_k(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                  std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float s = sigmoid(g);
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
}

// One block per row.
__global__ void rmsnorm_forward_k(float* out, float* rstd, const float* x, const float* weight, std::int64_t c,
                                  float eps) {
  const std::int64_t row = blockIdx.x;
  const float* xi = x + row * c;
  float* oi = out + row * c;
  double ss = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) ss += static_cast<double>(xi[j]) * xi[j];
  ss = block_sum(ss);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(c) + eps));
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) oi[j] = xi[j] * r * weight[j];
  if (rstd && threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_dx_k(float* dx, const float* dout, const float* x, const float* weight,
                                      const float* rstd, std::int64_t c) {
  const std::int64_t row = blockIdx.x;
  const float* xi = x + row * c;
  const float* gi = dout + row * c;
  float* dxi = dx + row * c;
  const float r = rstd[row];
  double dot = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x)
    dot += static_cast<double>(weight[j]) * gi[j] * (xi[j] * r);
  dot = block_sum(dot);
  const float mean = static_cast<float>(dot / static_cast<double>(c));
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dxi[j] += r * (weight[j] * gi[j] - xi[j] * r * mean);
}

// One thread per column, rows in order (coalesced across the columns of a warp).
__global__ void rmsnorm_backward_dw_k(float* dweight, const float* dout, const float* x, const float* rstd,
                                      std::int64_t n, std::int64_t c) {
  for (std::int64_t j = first_index(); j < c; j += grid_stride()) {
    float acc = dweight[j];
    for (std::int64_t i = 0; i < n; ++i) acc += dout[i * c + j] * (x[i * c + j] * rstd[i]);
    dweight[j] = acc;
  }
}

}  // namespace

void fill(void* s, float* x, std::int64_t n, float v) {
  if (n <= 0) return;
  fill_k<<<blocks_for(n), kThreads, 0, native(s)>>>(x, n, v);
  check_launch("fill");
}
void scale(void* s, float* x, std::int64_t n, float a) {
  if (n <= 0) return;
  scale_k<<<blocks_for(n), kThreads, 0, native(s)>>>(x, n, a);
  check_launch("scale");
}
void axpy(void* s, float* y, const float* x, std::int64_t n, float a) {
  if (n <= 0) return;
  axpy_k<<<blocks_for(n), kThreads, 0, native(s)>>>(y, x, n, a);
  check_launch("axpy");
}
void add(void* s, float* out, const float* a, const float* b, std::int64_t n) {
  if (n <= 0) return;
  add_k<<<blocks_for(n), kThreads, 0, native(s)>>>(out, a, b, n);
  check_launch("add");
}
void swiglu_forward(void* s, float* out, const float* gate, const float* up, std::int64_t n) {
  if (n <= 0) return;
  swiglu_forward_k<<<blocks_for(n), kThreads, 0, native(s)>>>(out, gate, up, n);
  check_launch("swiglu_forward");
}
void swiglu_backward(void* s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::int64_t n) {
  if (n <= 0) return;
  swiglu_backward_k<<<blocks_for(n), kThreads, 0, native(s)>>>(dgate, dup, dout, gate, up, n);
  check_launch("swiglu_backward");
}
void rmsnorm_forward(void* s, float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  if (n <= 0 || c <= 0) return;
  rmsnorm_forward_k<<<row_blocks(n, "rmsnorm"), kThreads, 0, native(s)>>>(out, rstd, x, weight, c, eps);
  check_launch("rmsnorm_forward");
}
void rmsnorm_backward(void* s, float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, std::int64_t n, std::int64_t c) {
  if (n <= 0 || c <= 0) return;
  rmsnorm_backward_dx_k<<<row_blocks(n, "rmsnorm"), kThreads, 0, native(s)>>>(dx, dout, x, weight, rstd, c);
  check_launch("rmsnorm_backward");
  rmsnorm_backward_dw_k<<<blocks_for(c), kThreads, 0, native(s)>>>(dweight, dout, x, rstd, n, c);
  check_launch("rmsnorm_backward");
}

}  // namespace peakbound::cuda
