#include "peakbound/kernels/cuda/moe_permute.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

// Element access over f32 and bf16 rows (core/dtype.h's widen/narrow on the device):
// ld widens exactly; st<T> rounds to nearest even with NaN kept quiet, to_bf16's bits.
__device__ inline float ld(float v) { return v; }
__device__ inline float ld(bf16 v) { return __uint_as_float(static_cast<std::uint32_t>(v.bits) << 16); }
template <typename T> __device__ T st(float v);
template <> __device__ inline float st<float>(float v) { return v; }
template <> __device__ inline bf16 st<bf16>(float v) {
  std::uint32_t u = __float_as_uint(v);
  bf16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.bits = static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  h.bits = static_cast<std::uint16_t>(u >> 16);
  return h;
}

// The fp32 routing weight in a row's weight slots: one float, or its bits over two
// bf16, high half first (kernels/cpu/moe_permute.h). Exact both ways.
template <typename T> constexpr std::int64_t kSlots = 1;
template <> constexpr std::int64_t kSlots<bf16> = 2;
template <typename T> __device__ T slot_value(float w, std::int64_t slot);
template <> __device__ inline float slot_value<float>(float w, std::int64_t) { return w; }
template <> __device__ inline bf16 slot_value<bf16>(float w, std::int64_t slot) {
  const std::uint32_t u = __float_as_uint(w);
  bf16 h;
  h.bits = static_cast<std::uint16_t>(slot == 0 ? u >> 16 : u & 0xffffu);
  return h;
}
template <typename T> __device__ inline void put_weight(T* slots, float w) {
  for (std::int64_t i = 0; i < kSlots<T>; ++i) slots[i] = slot_value<T>(w, i);
}
__device__ inline float get_weight(const float* slots) { return slots[0]; }
__device__ inline float get_weight(const bf16* slots) {
  return __uint_as_float(static_cast<std::uint32_t>(slots[0].bits) << 16 | slots[1].bits);
}

template <typename T>
__global__ void gather_rows_k(T* dst, const T* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  for (std::int64_t e = first_index(); e < n * width; e += grid_stride()) {
    const std::int64_t q = e / width, j = e % width;
    dst[e] = src[rows[q] * width + j];
  }
}

// Elements past x (forward) or past the weight slots (backward) are not written.
template <typename T>
__global__ void pack_rows_k(T* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                            std::int64_t H, const T* x, const T* dy, const float* w) {
  for (std::int64_t e = first_index(); e < n * width; e += grid_stride()) {
    const std::int64_t q = e / width, j = e % width, c = copies[q], t = c / K;
    if (j < H)
      dst[e] = x[t * H + j];
    else if (!dy)
      continue;
    else if (j < 2 * H)
      dst[e] = dy[t * H + (j - H)];
    else if (j - 2 * H < kSlots<T>)
      dst[e] = slot_value<T>(w[c], j - 2 * H);
  }
}

template <typename T>
__global__ void group_rows_k(T* xg, T* dyg, float* wg, const T* recv, std::int64_t width, const std::int64_t* perm,
                             std::int64_t n, std::int64_t H) {
  for (std::int64_t e = first_index(); e < n * H; e += grid_stride()) {
    const std::int64_t at = e / H, j = e % H;
    const T* row = recv + perm[at] * width;
    xg[e] = row[j];
    if (dyg) {
      dyg[e] = row[H + j];
      if (j == 0) wg[at] = get_weight(row + 2 * H);
    }
  }
}

template <typename T>
__global__ void ungroup_rows_k(T* out, std::int64_t width, const T* outg, const float* dwg, const std::int64_t* perm,
                               std::int64_t n, std::int64_t H) {
  for (std::int64_t e = first_index(); e < n * H; e += grid_stride()) {
    const std::int64_t at = e / H, j = e % H;
    T* row = out + perm[at] * width;
    row[j] = outg[e];
    if (dwg && j == 0) put_weight(row + H, dwg[at]);
  }
}

// One block per row.
template <typename T>
__global__ void dot_scale_rows_k(float* dw, T* dy, const T* o, const float* w, std::int64_t H) {
  const std::int64_t q = blockIdx.x;
  double dot = 0;
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x)
    dot += static_cast<double>(ld(dy[q * H + k])) * ld(o[q * H + k]);
  dot = block_sum(dot);  // every thread has read its dy before any scales it (block_sum syncs)
  const float wq = w[q];
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x) dy[q * H + k] = st<T>(__fmul_rn(ld(dy[q * H + k]), wq));
  if (threadIdx.x == 0) dw[q] = static_cast<float>(dot);
}

// One block per token segment; each thread owns columns of the token's row, sums them in
// fp32 and stores once.
template <typename T>
__global__ void unpack_rows_k(const T* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                              const std::int64_t* starts, std::int64_t K, std::int64_t H, T* y, const float* w, T* dx,
                              float* dw) {
  const std::int64_t a = starts[blockIdx.x], b = starts[blockIdx.x + 1];
  if (a == b) return;
  const std::int64_t t = copies[order[a]] / K;
  T* acc_row = (dx ? dx : y) + t * H;
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x) {
    float acc = ld(acc_row[k]);
    for (std::int64_t j = a; j < b; ++j) {
      const std::int64_t q = order[j];
      const float v = ld(src[q * width + k]);
      acc = dx ? __fadd_rn(acc, v) : __fadd_rn(acc, __fmul_rn(w[copies[q]], v));
    }
    acc_row[k] = st<T>(acc);
  }
  if (dx)
    for (std::int64_t j = a + threadIdx.x; j < b; j += blockDim.x)
      dw[copies[order[j]]] = get_weight(src + order[j] * width + H);
}

template <typename T>
void gather_rows(void* s, T* dst, const T* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  if (n <= 0 || width <= 0) return;
  gather_rows_k<<<blocks_for(n * width), kThreads, 0, native(s)>>>(dst, src, rows, n, width);
  check_launch("moe_gather_rows");
}

template <typename T>
void pack_rows(void* s, T* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
               std::int64_t H, const T* x, const T* dy, const float* w) {
  if (n <= 0 || width <= 0) return;
  pack_rows_k<<<blocks_for(n * width), kThreads, 0, native(s)>>>(dst, width, copies, n, K, H, x, dy, w);
  check_launch("moe_pack_rows");
}

template <typename T>
void group_rows(void* s, T* xg, T* dyg, float* wg, const T* recv, std::int64_t width, const std::int64_t* perm,
                std::int64_t n, std::int64_t H) {
  if (n <= 0 || H <= 0) return;
  group_rows_k<<<blocks_for(n * H), kThreads, 0, native(s)>>>(xg, dyg, wg, recv, width, perm, n, H);
  check_launch("moe_group_rows");
}

template <typename T>
void ungroup_rows(void* s, T* out, std::int64_t width, const T* outg, const float* dwg, const std::int64_t* perm,
                  std::int64_t n, std::int64_t H) {
  if (n <= 0 || H <= 0) return;
  ungroup_rows_k<<<blocks_for(n * H), kThreads, 0, native(s)>>>(out, width, outg, dwg, perm, n, H);
  check_launch("moe_ungroup_rows");
}

template <typename T>
void dot_scale_rows(void* s, float* dw, T* dy, const T* o, const float* w, std::int64_t m, std::int64_t H) {
  if (m <= 0) return;
  dot_scale_rows_k<<<row_blocks(m, "moe_dot_scale_rows"), kThreads, 0, native(s)>>>(dw, dy, o, w, H);
  check_launch("moe_dot_scale_rows");
}

template <typename T>
void unpack_rows(void* s, const T* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                 const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, T* y,
                 const float* w, T* dx, float* dw) {
  if (segments <= 0) return;
  unpack_rows_k<<<row_blocks(segments, "moe_unpack_rows"), kThreads, 0, native(s)>>>(src, width, copies, order,
                                                                                     starts, K, H, y, w, dx, dw);
  check_launch("moe_unpack_rows");
}

}  // namespace

void moe_gather_rows(void* s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  gather_rows(s, dst, src, rows, n, width);
}
void moe_gather_rows(void* s, bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  gather_rows(s, dst, src, rows, n, width);
}

void moe_pack_rows(void* s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  pack_rows(s, dst, width, copies, n, K, H, x, dy, w);
}
void moe_pack_rows(void* s, bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const bf16* x, const bf16* dy, const float* w) {
  pack_rows(s, dst, width, copies, n, K, H, x, dy, w);
}

void moe_group_rows(void* s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  group_rows(s, xg, dyg, wg, recv, width, perm, n, H);
}
void moe_group_rows(void* s, bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  group_rows(s, xg, dyg, wg, recv, width, perm, n, H);
}

void moe_ungroup_rows(void* s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  ungroup_rows(s, out, width, outg, dwg, perm, n, H);
}
void moe_ungroup_rows(void* s, bf16* out, std::int64_t width, const bf16* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  ungroup_rows(s, out, width, outg, dwg, perm, n, H);
}

void moe_dot_scale_rows(void* s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  dot_scale_rows(s, dw, dy, o, w, m, H);
}
void moe_dot_scale_rows(void* s, float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  dot_scale_rows(s, dw, dy, o, w, m, H);
}

void moe_unpack_rows(void* s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw) {
  unpack_rows(s, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}
void moe_unpack_rows(void* s, const bf16* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, bf16* y, const float* w, bf16* dx, float* dw) {
  unpack_rows(s, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}

}  // namespace peakbound::cuda
