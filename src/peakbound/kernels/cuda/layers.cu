#include "peakbound/kernels/cuda/layers.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

__global__ void rope_tables_k(float* cos_t, float* sin_t, std::int64_t t, std::int64_t d, std::int64_t offset,
                              double theta) {
  const std::int64_t half = d / 2;
  for (std::int64_t e = first_index(); e < t * half; e += grid_stride()) {
    const std::int64_t p = e / half, i = e % half;
    const double inv_freq = pow(theta, -static_cast<double>(2 * i) / static_cast<double>(d));
    const double angle = static_cast<double>(offset + p) * inv_freq;
    cos_t[e] = static_cast<float>(cos(angle));
    sin_t[e] = static_cast<float>(sin(angle));
  }
}

// One thread per (position, head, i < D/2) pair of rotated values.
__global__ void rope_rotate_k(float* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
                              std::int64_t d, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t e = first_index(); e < t * heads * half; e += grid_stride()) {
    const std::int64_t i = e % half, ph = e / half, p = ph / heads;
    float* x1 = x + ph * d;
    float* x2 = x1 + half;
    const float c = cos_t[p * half + i], si = sign * sin_t[p * half + i];
    const float a = x1[i], b = x2[i];
    x1[i] = a * c - b * si;
    x2[i] = b * c + a * si;
  }
}

__global__ void embedding_forward_k(float* out, const std::int32_t* ids, const float* table, std::int64_t T,
                                    std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t e = first_index(); e < T * H; e += grid_stride()) {
    const std::int64_t t = e / H, h = e % H;
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    out[e] = (r >= 0 && r < rows) ? table[r * H + h] : 0.0f;
  }
}

__global__ void embedding_backward_k(float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T,
                                     std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t h = first_index(); h < H; h += grid_stride())
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
      if (r >= 0 && r < rows) dtable[r * H + h] += dout[t * H + h];
    }
}

__global__ void row_gate_forward_k(float* out, const float* x, const float* z, std::int64_t m, std::int64_t n,
                                   bool accumulate) {
  for (std::int64_t e = first_index(); e < m * n; e += grid_stride()) {
    const float s = sigmoid(z[e / n]);
    out[e] = accumulate ? out[e] + s * x[e] : s * x[e];
  }
}

// One block per row.
__global__ void row_gate_backward_k(float* dx, float* dz, const float* dout, const float* x, const float* z,
                                    std::int64_t n) {
  const std::int64_t r = blockIdx.x;
  const float s = sigmoid(z[r]);
  double dot = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += static_cast<double>(dout[r * n + j]) * x[r * n + j];
  dot = block_sum(dot);
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) dx[r * n + j] = s * dout[r * n + j];
  if (threadIdx.x == 0) dz[r] = static_cast<float>(dot) * s * (1.0f - s);
}

}  // namespace

void rope_tables(void* s, float* cos_t, float* sin_t, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta) {
  if (t <= 0) return;
  rope_tables_k<<<blocks_for(t * (d / 2)), kThreads, 0, native(s)>>>(cos_t, sin_t, t, d, offset, theta);
  check_launch("rope_tables");
}

void rope_rotate(void* s, float* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign) {
  if (t <= 0 || heads <= 0 || !x) return;
  rope_rotate_k<<<blocks_for(t * heads * (d / 2)), kThreads, 0, native(s)>>>(x, cos_t, sin_t, t, heads, d, sign);
  check_launch("rope_rotate");
}

void embedding_forward(void* s, float* out, const std::int32_t* ids, const float* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  if (T <= 0 || H <= 0) return;
  embedding_forward_k<<<blocks_for(T * H), kThreads, 0, native(s)>>>(out, ids, table, T, H, row_offset, rows);
  check_launch("embedding_forward");
}

void embedding_backward(void* s, float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  if (T <= 0 || H <= 0) return;
  embedding_backward_k<<<blocks_for(H), kThreads, 0, native(s)>>>(dtable, ids, dout, T, H, row_offset, rows);
  check_launch("embedding_backward");
}

void row_gate_forward(void* s, float* out, const float* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate) {
  if (m <= 0 || n <= 0) return;
  row_gate_forward_k<<<blocks_for(m * n), kThreads, 0, native(s)>>>(out, x, z, m, n, accumulate);
  check_launch("row_gate_forward");
}

void row_gate_backward(void* s, float* dx, float* dz, const float* dout, const float* x, const float* z,
                       std::int64_t m, std::int64_t n) {
  if (m <= 0) return;
  row_gate_backward_k<<<row_blocks(m, "row_gate"), kThreads, 0, native(s)>>>(dx, dz, dout, x, z, n);
  check_launch("row_gate_backward");
}

}  // namespace peakbound::cuda
