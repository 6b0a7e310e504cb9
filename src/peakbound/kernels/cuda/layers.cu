#include "peakbound/kernels/cuda/layers.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

// Element access over float and bf16 storage, as core/dtype.h's widen / narrow: loads
// widen exactly, stores round once, to nearest even with NaN quieted: to_bf16 bit for bit.
__device__ inline float wide(float x) { return x; }
__device__ inline float wide(bf16 x) { return __uint_as_float(static_cast<std::uint32_t>(x.bits) << 16); }
template <typename S> __device__ S stored(float x);
template <> __device__ inline float stored<float>(float x) { return x; }
template <> __device__ inline bf16 stored<bf16>(float x) {
  std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

__global__ void rope_tables_k(float* cos_t, float* sin_t, std::int64_t t, std::int64_t d, std::int64_t offset,
                              double theta, RopeScaling scaling) {
  const std::int64_t half = d / 2;
  const double a = rope_table_factor(scaling);
  for (std::int64_t e = first_index(); e < t * half; e += grid_stride()) {
    const std::int64_t p = e / half, i = e % half;
    const double inv_freq = rope_inv_freq(theta, scaling, i, d);
    const double angle = static_cast<double>(offset + p) * inv_freq;
    cos_t[e] = static_cast<float>(cos(angle) * a);
    sin_t[e] = static_cast<float>(sin(angle) * a);
  }
}

// One thread per (position, head, i < D/2) pair of rotated values. S: x's storage.
template <typename S>
__global__ void rope_rotate_k(S* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
                              std::int64_t d, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t e = first_index(); e < t * heads * half; e += grid_stride()) {
    const std::int64_t i = e % half, ph = e / half, p = ph / heads;
    S* x1 = x + ph * d;
    S* x2 = x1 + half;
    const float c = cos_t[p * half + i], si = sign * sin_t[p * half + i];
    const float a = wide(x1[i]), b = wide(x2[i]);
    x1[i] = stored<S>(a * c - b * si);
    x2[i] = stored<S>(b * c + a * si);
  }
}

// S: the storage of table and out; a copy, so out's bits are the table's.
template <typename S>
__global__ void embedding_forward_k(S* out, const std::int32_t* ids, const S* table, std::int64_t T, std::int64_t H,
                                    std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t e = first_index(); e < T * H; e += grid_stride()) {
    const std::int64_t t = e / H, h = e % H;
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    out[e] = (r >= 0 && r < rows) ? table[r * H + h] : stored<S>(0.0f);
  }
}

// G: dout's storage, widened; dtable is fp32.
template <typename G>
__global__ void embedding_backward_k(float* dtable, const std::int32_t* ids, const G* dout, std::int64_t T,
                                     std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t h = first_index(); h < H; h += grid_stride())
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
      if (r >= 0 && r < rows) dtable[r * H + h] += wide(dout[t * H + h]);
    }
}

// S: the storage of x, out, dout, dx, dz; z is fp32.
template <typename S>
__global__ void row_gate_forward_k(S* out, const S* x, const float* z, std::int64_t m, std::int64_t n,
                                   bool accumulate) {
  for (std::int64_t e = first_index(); e < m * n; e += grid_stride()) {
    const float s = sigmoid(z[e / n]);
    out[e] = stored<S>(accumulate ? wide(out[e]) + s * wide(x[e]) : s * wide(x[e]));
  }
}

// One block per row.
template <typename S>
__global__ void row_gate_backward_k(S* dx, S* dz, const S* dout, const S* x, const float* z, std::int64_t n) {
  const std::int64_t r = blockIdx.x;
  const float s = sigmoid(z[r]);
  double dot = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x)
    dot += static_cast<double>(wide(dout[r * n + j])) * wide(x[r * n + j]);
  dot = block_sum(dot);
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) dx[r * n + j] = stored<S>(s * wide(dout[r * n + j]));
  if (threadIdx.x == 0) dz[r] = stored<S>(static_cast<float>(dot) * s * (1.0f - s));
}

template <typename S>
void rotate(void* s, S* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
            std::int64_t d, float sign) {
  if (t <= 0 || heads <= 0 || !x) return;
  rope_rotate_k<<<blocks_for(t * heads * (d / 2)), kThreads, 0, native(s)>>>(x, cos_t, sin_t, t, heads, d, sign);
  check_launch("rope_rotate");
}

template <typename S>
void embed(void* s, S* out, const std::int32_t* ids, const S* table, std::int64_t T, std::int64_t H,
           std::int64_t row_offset, std::int64_t rows) {
  if (T <= 0 || H <= 0) return;
  embedding_forward_k<<<blocks_for(T * H), kThreads, 0, native(s)>>>(out, ids, table, T, H, row_offset, rows);
  check_launch("embedding_forward");
}

template <typename G>
void embed_backward(void* s, float* dtable, const std::int32_t* ids, const G* dout, std::int64_t T, std::int64_t H,
                    std::int64_t row_offset, std::int64_t rows) {
  if (T <= 0 || H <= 0) return;
  embedding_backward_k<<<blocks_for(H), kThreads, 0, native(s)>>>(dtable, ids, dout, T, H, row_offset, rows);
  check_launch("embedding_backward");
}

template <typename S>
void gate(void* s, S* out, const S* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  row_gate_forward_k<<<blocks_for(m * n), kThreads, 0, native(s)>>>(out, x, z, m, n, accumulate);
  check_launch("row_gate_forward");
}

template <typename S>
void gate_backward(void* s, S* dx, S* dz, const S* dout, const S* x, const float* z, std::int64_t m, std::int64_t n) {
  if (m <= 0) return;
  row_gate_backward_k<<<row_blocks(m, "row_gate"), kThreads, 0, native(s)>>>(dx, dz, dout, x, z, n);
  check_launch("row_gate_backward");
}

}  // namespace

void rope_tables(void* s, float* cos_t, float* sin_t, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta, const RopeScaling& scaling) {
  if (t <= 0) return;
  rope_tables_k<<<blocks_for(t * (d / 2)), kThreads, 0, native(s)>>>(cos_t, sin_t, t, d, offset, theta, scaling);
  check_launch("rope_tables");
}

void rope_rotate(void* s, float* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign) {
  rotate(s, x, cos_t, sin_t, t, heads, d, sign);
}

void rope_rotate(void* s, bf16* x, const float* cos_t, const float* sin_t, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign) {
  rotate(s, x, cos_t, sin_t, t, heads, d, sign);
}

void embedding_forward(void* s, float* out, const std::int32_t* ids, const float* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  embed(s, out, ids, table, T, H, row_offset, rows);
}

void embedding_forward(void* s, bf16* out, const std::int32_t* ids, const bf16* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  embed(s, out, ids, table, T, H, row_offset, rows);
}

void embedding_backward(void* s, float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  embed_backward(s, dtable, ids, dout, T, H, row_offset, rows);
}

void embedding_backward(void* s, float* dtable, const std::int32_t* ids, const bf16* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  embed_backward(s, dtable, ids, dout, T, H, row_offset, rows);
}

void row_gate_forward(void* s, float* out, const float* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate) {
  gate(s, out, x, z, m, n, accumulate);
}

void row_gate_forward(void* s, bf16* out, const bf16* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate) {
  gate(s, out, x, z, m, n, accumulate);
}

void row_gate_backward(void* s, float* dx, float* dz, const float* dout, const float* x, const float* z,
                       std::int64_t m, std::int64_t n) {
  gate_backward(s, dx, dz, dout, x, z, m, n);
}

void row_gate_backward(void* s, bf16* dx, bf16* dz, const bf16* dout, const bf16* x, const float* z,
                       std::int64_t m, std::int64_t n) {
  gate_backward(s, dx, dz, dout, x, z, m, n);
}

}  // namespace peakbound::cuda
