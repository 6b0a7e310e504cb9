#include "peakbound/kernels/cuda/moe_permute.h"

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

__global__ void gather_rows_k(float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                              std::int64_t width) {
  for (std::int64_t e = first_index(); e < n * width; e += grid_stride()) {
    const std::int64_t q = e / width, j = e % width;
    dst[e] = src[rows[q] * width + j];
  }
}

__global__ void pack_rows_k(float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                            std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  for (std::int64_t e = first_index(); e < n * width; e += grid_stride()) {
    const std::int64_t q = e / width, j = e % width, c = copies[q], t = c / K;
    dst[e] = j < H ? x[t * H + j] : j < 2 * H ? dy[t * H + (j - H)] : w[c];
  }
}

__global__ void group_rows_k(float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                             const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  for (std::int64_t e = first_index(); e < n * H; e += grid_stride()) {
    const std::int64_t at = e / H, j = e % H;
    const float* row = recv + perm[at] * width;
    xg[e] = row[j];
    if (dyg) {
      dyg[e] = row[H + j];
      if (j == 0) wg[at] = row[2 * H];
    }
  }
}

__global__ void ungroup_rows_k(float* out, std::int64_t width, const float* outg, const float* dwg,
                               const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  for (std::int64_t e = first_index(); e < n * H; e += grid_stride()) {
    const std::int64_t at = e / H, j = e % H;
    float* row = out + perm[at] * width;
    row[j] = outg[e];
    if (dwg && j == 0) row[H] = dwg[at];
  }
}

// One block per row.
__global__ void dot_scale_rows_k(float* dw, float* dy, const float* o, const float* w, std::int64_t H) {
  const std::int64_t q = blockIdx.x;
  double dot = 0;
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x) dot += static_cast<double>(dy[q * H + k]) * o[q * H + k];
  dot = block_sum(dot);  // every thread has read its dy before any scales it (block_sum syncs)
  const float wq = w[q];
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x) dy[q * H + k] = __fmul_rn(dy[q * H + k], wq);
  if (threadIdx.x == 0) dw[q] = static_cast<float>(dot);
}

// One block per token segment; each thread owns columns of the token's row.
__global__ void unpack_rows_k(const float* src, std::int64_t width, const std::int64_t* copies,
                              const std::int64_t* order, const std::int64_t* starts, std::int64_t K, std::int64_t H,
                              float* y, const float* w, float* dx, float* dw) {
  const std::int64_t a = starts[blockIdx.x], b = starts[blockIdx.x + 1];
  if (a == b) return;
  const std::int64_t t = copies[order[a]] / K;
  float* acc_row = (dx ? dx : y) + t * H;
  for (std::int64_t k = threadIdx.x; k < H; k += blockDim.x) {
    float acc = acc_row[k];
    for (std::int64_t j = a; j < b; ++j) {
      const std::int64_t q = order[j];
      const float v = src[q * width + k];
      acc = dx ? __fadd_rn(acc, v) : __fadd_rn(acc, __fmul_rn(w[copies[q]], v));
    }
    acc_row[k] = acc;
  }
  if (dx)
    for (std::int64_t j = a + threadIdx.x; j < b; j += blockDim.x) dw[copies[order[j]]] = src[order[j] * width + H];
}

}  // namespace

void moe_gather_rows(void* s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  if (n <= 0 || width <= 0) return;
  gather_rows_k<<<blocks_for(n * width), kThreads, 0, native(s)>>>(dst, src, rows, n, width);
  check_launch("moe_gather_rows");
}

void moe_pack_rows(void* s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  if (n <= 0 || width <= 0) return;
  pack_rows_k<<<blocks_for(n * width), kThreads, 0, native(s)>>>(dst, width, copies, n, K, H, x, dy, w);
  check_launch("moe_pack_rows");
}

void moe_group_rows(void* s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  if (n <= 0 || H <= 0) return;
  group_rows_k<<<blocks_for(n * H), kThreads, 0, native(s)>>>(xg, dyg, wg, recv, width, perm, n, H);
  check_launch("moe_group_rows");
}

void moe_ungroup_rows(void* s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  if (n <= 0 || H <= 0) return;
  ungroup_rows_k<<<blocks_for(n * H), kThreads, 0, native(s)>>>(out, width, outg, dwg, perm, n, H);
  check_launch("moe_ungroup_rows");
}

void moe_dot_scale_rows(void* s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  if (m <= 0) return;
  dot_scale_rows_k<<<row_blocks(m, "moe_dot_scale_rows"), kThreads, 0, native(s)>>>(dw, dy, o, w, H);
  check_launch("moe_dot_scale_rows");
}

void moe_unpack_rows(void* s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw) {
  if (segments <= 0) return;
  unpack_rows_k<<<row_blocks(segments, "moe_unpack_rows"), kThreads, 0, native(s)>>>(src, width, copies, order,
                                                                                     starts, K, H, y, w, dx, dw);
  check_launch("moe_unpack_rows");
}

}  // namespace peakbound::cuda
