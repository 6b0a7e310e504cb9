#include "peakbound/kernels/cuda/attention.h"

#include <cstdlib>
#include <string>

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

constexpr int kWarps = 4;                         // warps per block
constexpr int kPerLane = kMaxHeadDim / 32;        // head-dim values a lane holds

// Plain-data copy of the dims a kernel needs.
struct Dims {
  std::int64_t T, Tk, Hq, Hkv, D, Dv, W, q_off, k_off;
  float scale;
  bool acc;
};

Dims dims_of(const AttentionDims& a) {
  return Dims{a.tokens, a.key_tokens(), a.q_heads, a.kv_heads, a.qk_dim, a.v_dim, a.window, a.q_offset, a.k_offset,
              a.effective_scale(), a.accumulate};
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline double warp_sum_d(double v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Keys [lo, hi] (inclusive, in key rows) visible to query row i; empty when hi < lo.
__device__ inline void visible_keys(const Dims& d, std::int64_t i, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t qpos = d.q_off + i;
  hi = qpos - d.k_off;
  if (hi > d.Tk - 1) hi = d.Tk - 1;
  lo = 0;
  if (d.W > 0 && qpos - d.W + 1 - d.k_off > lo) lo = qpos - d.W + 1 - d.k_off;
}

// Query rows [lo, hi] that see key row j.
__device__ inline void seeing_queries(const Dims& d, std::int64_t j, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t kpos = d.k_off + j;
  lo = kpos - d.q_off;
  if (lo < 0) lo = 0;
  hi = d.T - 1;
  if (d.W > 0 && kpos + d.W - 1 - d.q_off < hi) hi = kpos + d.W - 1 - d.q_off;
}

// Element e of a tensor in its storage type, widened to fp32 (exact for bf16: its bits
// are the top half of the float's, as core/dtype.h's to_f32).
__device__ inline float ld(const float* x, std::int64_t e) { return x[e]; }
__device__ inline float ld(const bf16* x, std::int64_t e) {
  return __uint_as_float(static_cast<unsigned>(x[e].bits) << 16);
}

// Loads row x [n] into the lane's registers (value c * 32 + lane at r[c]).
template <typename T>
__device__ inline void load_row(float* r, const T* x, std::int64_t n) {
  const int lane = threadIdx.x % 32;
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = c * 32 + lane;
    r[c] = e < n ? ld(x, e) : 0.0f;
  }
}
template <typename T>
__device__ inline float dot_row(const float* r, const T* x, std::int64_t n) {
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = c * 32 + lane;
    if (e < n) s += r[c] * ld(x, e);
  }
  return warp_sum(s);
}

// A forward row's end, from its running max m and sum l over this call's keys and, in the
// accumulate mode, the running state's lse L0: merge folds the block into the running
// output (out = out * keep + acc * take); otherwise out = acc / l, or 0 for a row that saw
// no key (empty). write is false where the block adds nothing to a running state.
struct RowEnd {
  bool write, merge, empty;
  float keep, take, l, lse;
  __device__ float value(float old, float a) const { return merge ? old * keep + a * take : empty ? 0.0f : a / l; }
};
__device__ inline RowEnd row_end(float m, float l, bool accumulate, const float* L) {
  const bool empty = l == 0.0f;
  const float bl = empty ? -INFINITY : m + logf(l);
  if (accumulate && *L != -INFINITY) {
    if (empty) return {false, false, true, 0.0f, 0.0f, l, *L};
    const float L0 = *L, M = L0 > bl ? L0 : bl;
    const float nl = M + logf(expf(L0 - M) + expf(bl - M));
    return {true, true, false, expf(L0 - nl), expf(bl - nl) / l, l, nl};
  }
  return {true, false, empty, 0.0f, 0.0f, l, bl};
}

template <typename T>
__global__ void forward_k(float* out, float* lse, const T* q, const T* k, const T* v, Dims d) {
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  if (w >= d.T * d.Hq) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t i = w / d.Hq, h = w % d.Hq, g = h / (d.Hq / d.Hkv);
  float qr[kPerLane], acc[kPerLane];
  load_row(qr, q + (i * d.Hq + h) * d.D, d.D);
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  std::int64_t lo, hi;
  visible_keys(d, i, lo, hi);
  for (std::int64_t j = lo; j <= hi; ++j) {
    const float s = d.scale * dot_row(qr, k + (j * d.Hkv + g) * d.D, d.D);
    const float m_new = s > m ? s : m;
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
    const T* vr = v + (j * d.Hkv + g) * d.Dv;
    for (int c = 0; c < kPerLane; ++c) {
      const std::int64_t e = c * 32 + lane;
      acc[c] = acc[c] * corr + (e < d.Dv ? p * ld(vr, e) : 0.0f);
    }
    m = m_new;
  }
  float* o = out + (i * d.Hq + h) * d.Dv;
  float* L = lse + i * d.Hq + h;
  const RowEnd end = row_end(m, l, d.acc, L);
  if (!end.write) return;
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = c * 32 + lane;
    if (e < d.Dv) o[e] = end.value(end.merge ? o[e] : 0.0f, acc[c]);
  }
  if (lane == 0) *L = end.lse;
}

template <typename T>
__global__ void row_dot_k(float* row_dot, const T* dout, const T* out, Dims d) {
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  if (w >= d.T * d.Hq) return;
  const int lane = threadIdx.x % 32;
  double s = 0;
  for (std::int64_t e = lane; e < d.Dv; e += 32)
    s += static_cast<double>(ld(dout, w * d.Dv + e)) * ld(out, w * d.Dv + e);
  s = warp_sum_d(s);
  if (lane == 0) row_dot[w] = static_cast<float>(s);
}

// dq for one (query row, head).
template <typename T>
__global__ void backward_dq_k(float* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                              const float* Drow, Dims d) {
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  if (w >= d.T * d.Hq) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t i = w / d.Hq, h = w % d.Hq, g = h / (d.Hq / d.Hkv);
  float qr[kPerLane], gr[kPerLane], acc[kPerLane];
  load_row(qr, q + w * d.D, d.D);
  load_row(gr, dout + w * d.Dv, d.Dv);
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.0f;
  const float L = lse[w], Di = Drow[w];
  std::int64_t lo, hi;
  visible_keys(d, i, lo, hi);
  if (L == -INFINITY) hi = lo - 1;  // the row saw no key anywhere
  for (std::int64_t j = lo; j <= hi; ++j) {
    const T* kr = k + (j * d.Hkv + g) * d.D;
    const float p = expf(d.scale * dot_row(qr, kr, d.D) - L);
    const float dp = dot_row(gr, v + (j * d.Hkv + g) * d.Dv, d.Dv);
    const float ds = p * (dp - Di);
    for (int c = 0; c < kPerLane; ++c) {
      const std::int64_t e = c * 32 + lane;
      if (e < d.D) acc[c] += d.scale * ds * ld(kr, e);
    }
  }
  float* o = dq + w * d.D;
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = c * 32 + lane;
    if (e < d.D) o[e] = d.acc ? o[e] + acc[c] : acc[c];
  }
}

// dk, dv for one (key row, kv head), over the query heads of its group and the query
// rows that see it.
template <typename T>
__global__ void backward_dkv_k(float* dk, float* dv, const T* dout, const T* q, const T* k, const T* v,
                               const float* lse, const float* Drow, Dims d) {
  const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  if (w >= d.Tk * d.Hkv) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t j = w / d.Hkv, g = w % d.Hkv, group = d.Hq / d.Hkv;
  float kr[kPerLane], vr[kPerLane], ak[kPerLane], av[kPerLane];
  load_row(kr, k + w * d.D, d.D);
  load_row(vr, v + w * d.Dv, d.Dv);
  for (int c = 0; c < kPerLane; ++c) ak[c] = av[c] = 0.0f;
  std::int64_t lo, hi;
  seeing_queries(d, j, lo, hi);
  for (std::int64_t i = lo; i <= hi; ++i)
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      const std::int64_t r = i * d.Hq + h;
      const float L = lse[r];
      if (L == -INFINITY) continue;
      const T* qrow = q + r * d.D;
      const T* grow = dout + r * d.Dv;
      const float p = expf(d.scale * dot_row(kr, qrow, d.D) - L);
      const float dp = dot_row(vr, grow, d.Dv);
      const float ds = p * (dp - Drow[r]);
      for (int c = 0; c < kPerLane; ++c) {
        const std::int64_t e = c * 32 + lane;
        if (e < d.Dv) av[c] += p * ld(grow, e);
        if (e < d.D) ak[c] += d.scale * ds * ld(qrow, e);
      }
    }
  float* ok = dk + w * d.D;
  float* ov = dv + w * d.Dv;
  for (int c = 0; c < kPerLane; ++c) {
    const std::int64_t e = c * 32 + lane;
    if (e < d.D) ok[e] = d.acc ? ok[e] + ak[c] : ak[c];
    if (e < d.Dv) ov[e] = d.acc ? ov[e] + av[c] : av[c];
  }
}

// ---------------------------------------------------------------------------------------
// The tiled kernels (head dims up to DT = 32 or 64): one thread per query row (forward,
// dq) or key row (dk, dv), a block of kRows rows of one head, the other side's rows staged
// through shared memory kTile at a time as fp32 (widened once, read by every thread of the
// block as a broadcast). Per tile the forward takes the tile's row maximum first and
// rescales its running sum and output once (FlashAttention-2's order), not once per key.
// The same contract and the same visible keys as the simple kernels above; each output is
// still owned by one thread (no atomics: the same bits every run). The sums run in another
// order than the simple kernels' warp reductions, so the two differ by rounding.

constexpr int kRows = 64;  // query (or key) rows of a block: one a thread
constexpr int kTile = 32;  // key (or query) rows staged in shared memory at a time

template <int DT, typename T>
__device__ inline void load_reg(float (&r)[DT], const T* x, std::int64_t n) {
#pragma unroll
  for (int c = 0; c < DT; ++c) r[c] = c < n ? ld(x, c) : 0.0f;
}

// Rows [r0, r0 + n) of x (row r at x + (r * heads + head) * width, `width` values) into
// tile[kTile][DT], zero past n rows and past width columns; every thread of the block.
template <int DT, int Threads, typename T>
__device__ inline void stage(float (*tile)[DT], const T* x, std::int64_t r0, int n, std::int64_t heads,
                             std::int64_t head, std::int64_t width) {
  for (int e = threadIdx.x; e < kTile * DT; e += Threads) {
    const int r = e / DT, c = e % DT;
    tile[r][c] = r < n && c < width ? ld(x, ((r0 + r) * heads + head) * width + c) : 0.0f;
  }
}

// The rows a staged tile holds: [r0, r0 + n) of the block's range, which ends at block_hi.
__device__ inline int tile_rows(std::int64_t r0, std::int64_t block_hi) {
  return block_hi - r0 + 1 < kTile ? static_cast<int>(block_hi - r0 + 1) : kTile;
}
// The tile-relative part [a, b] of a thread's own range [lo, hi] (empty when a > b). Taken
// after the tile is staged, so that it is not live across the staging (at DT 64 that
// costs the dk/dv kernel more spills).
struct TilePart {
  std::int64_t a, b;
};
__device__ inline TilePart tile_part(std::int64_t r0, int n, std::int64_t lo, std::int64_t hi) {
  return {lo - r0 > 0 ? lo - r0 : 0, hi - r0 < n - 1 ? hi - r0 : n - 1};
}

template <int DT>
__device__ inline float dot(const float (&a)[DT], const float* b) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < DT; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

template <typename T, int DT>
__global__ void __launch_bounds__(kRows) forward_tiled_k(float* out, float* lse, const T* q, const T* k, const T* v,
                                                         Dims d) {
  __shared__ float ks[kTile][DT], vs[kTile][DT];
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * kRows, h = blockIdx.y, g = h / (d.Hq / d.Hkv);
  const std::int64_t i = i0 + threadIdx.x, last = (i0 + kRows < d.T ? i0 + kRows : d.T) - 1;
  const bool row = i < d.T;
  float qr[DT], acc[DT];
#pragma unroll
  for (int c = 0; c < DT; ++c) acc[c] = 0.0f;
  std::int64_t lo = 0, hi = -1, blo, bhi, unused;
  if (row) {
    load_reg(qr, q + (i * d.Hq + h) * d.D, d.D);
    visible_keys(d, i, lo, hi);
  }
  visible_keys(d, i0, blo, unused);    // the block's first visible key
  visible_keys(d, last, unused, bhi);  // and its last
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t j0 = blo; j0 <= bhi; j0 += kTile) {
    const int n = tile_rows(j0, bhi);
    __syncthreads();  // the previous tile's readers are done
    stage<DT, kRows>(ks, k, j0, n, d.Hkv, g, d.D);
    stage<DT, kRows>(vs, v, j0, n, d.Hkv, g, d.Dv);
    __syncthreads();
    const auto [a, b] = tile_part(j0, n, lo, hi);
    if (a > b) continue;  // none of this tile's keys is visible to the row
    float sc[kTile];
    float mt = m;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      sc[jj] = jj >= a && jj <= b ? d.scale * dot(qr, ks[jj]) : -INFINITY;
      mt = sc[jj] > mt ? sc[jj] : mt;
    }
    const float corr = expf(m - mt);
    l *= corr;
#pragma unroll
    for (int c = 0; c < DT; ++c) acc[c] *= corr;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      const float p = jj >= a && jj <= b ? expf(sc[jj] - mt) : 0.0f;
      l += p;
#pragma unroll
      for (int c = 0; c < DT; ++c) acc[c] = fmaf(p, vs[jj][c], acc[c]);
    }
    m = mt;
  }
  if (!row) return;
  float* o = out + (i * d.Hq + h) * d.Dv;
  float* L = lse + i * d.Hq + h;
  const RowEnd end = row_end(m, l, d.acc, L);
  if (!end.write) return;
#pragma unroll
  for (int c = 0; c < DT; ++c)
    if (c < d.Dv) o[c] = end.value(end.merge ? o[c] : 0.0f, acc[c]);
  *L = end.lse;
}

// dq for kRows query rows of one head.
template <typename T, int DT>
__global__ void __launch_bounds__(kRows) backward_dq_tiled_k(float* dq, const T* dout, const T* q, const T* k,
                                                             const T* v, const float* lse, const float* Drow, Dims d) {
  __shared__ float ks[kTile][DT], vs[kTile][DT];
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * kRows, h = blockIdx.y, g = h / (d.Hq / d.Hkv);
  const std::int64_t i = i0 + threadIdx.x, last = (i0 + kRows < d.T ? i0 + kRows : d.T) - 1;
  const bool row = i < d.T;
  const std::int64_t w = i * d.Hq + h;
  float qr[DT], gr[DT], acc[DT];
#pragma unroll
  for (int c = 0; c < DT; ++c) acc[c] = 0.0f;
  std::int64_t lo = 0, hi = -1, blo, bhi, unused;
  float L = -INFINITY, Di = 0.0f;
  if (row) {
    load_reg(qr, q + w * d.D, d.D);
    load_reg(gr, dout + w * d.Dv, d.Dv);
    L = lse[w], Di = Drow[w];
    visible_keys(d, i, lo, hi);
    if (L == -INFINITY) hi = lo - 1;  // the row saw no key anywhere
  }
  visible_keys(d, i0, blo, unused);
  visible_keys(d, last, unused, bhi);
  for (std::int64_t j0 = blo; j0 <= bhi; j0 += kTile) {
    const int n = tile_rows(j0, bhi);
    __syncthreads();
    stage<DT, kRows>(ks, k, j0, n, d.Hkv, g, d.D);
    stage<DT, kRows>(vs, v, j0, n, d.Hkv, g, d.Dv);
    __syncthreads();
    const auto [a, b] = tile_part(j0, n, lo, hi);
    if (a > b) continue;
#pragma unroll 4
    for (int jj = 0; jj < kTile; ++jj) {
      if (jj < a || jj > b) continue;
      const float p = expf(d.scale * dot(qr, ks[jj]) - L);
      const float ds = d.scale * (p * (dot(gr, vs[jj]) - Di));
#pragma unroll
      for (int c = 0; c < DT; ++c) acc[c] = fmaf(ds, ks[jj][c], acc[c]);
    }
  }
  if (!row) return;
  float* o = dq + w * d.D;
#pragma unroll
  for (int c = 0; c < DT; ++c)
    if (c < d.D) o[c] = d.acc ? o[c] + acc[c] : acc[c];
}

// dk, dv for kRows key rows of one kv head, over the query heads of its group and the
// query rows that see them (staged with their lse and D_i).
template <typename T, int DT>
__global__ void __launch_bounds__(kRows) backward_dkv_tiled_k(float* dk, float* dv, const T* dout, const T* q,
                                                              const T* k, const T* v, const float* lse,
                                                              const float* Drow, Dims d) {
  __shared__ float qs[kTile][DT], gs[kTile][DT], ls[kTile], ds_[kTile];
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kRows, g = blockIdx.y, group = d.Hq / d.Hkv;
  const std::int64_t j = j0 + threadIdx.x, last = (j0 + kRows < d.Tk ? j0 + kRows : d.Tk) - 1;
  const bool row = j < d.Tk;
  const std::int64_t w = j * d.Hkv + g;
  float kr[DT], vr[DT], ak[DT], av[DT];
#pragma unroll
  for (int c = 0; c < DT; ++c) ak[c] = av[c] = 0.0f;
  std::int64_t lo = 0, hi = -1, blo, bhi, unused;
  if (row) {
    load_reg(kr, k + w * d.D, d.D);
    load_reg(vr, v + w * d.Dv, d.Dv);
    seeing_queries(d, j, lo, hi);
  }
  seeing_queries(d, j0, blo, unused);    // the block's first seeing query
  seeing_queries(d, last, unused, bhi);  // and its last
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
    for (std::int64_t i0 = blo; i0 <= bhi; i0 += kTile) {
      const int n = tile_rows(i0, bhi);
      __syncthreads();
      stage<DT, kRows>(qs, q, i0, n, d.Hq, h, d.D);
      stage<DT, kRows>(gs, dout, i0, n, d.Hq, h, d.Dv);
      if (threadIdx.x < kTile) {
        const int r = threadIdx.x;
        ls[r] = r < n ? lse[(i0 + r) * d.Hq + h] : -INFINITY;
        ds_[r] = r < n ? Drow[(i0 + r) * d.Hq + h] : 0.0f;
      }
      __syncthreads();
      const auto [a, b] = tile_part(i0, n, lo, hi);
      if (a > b) continue;
#pragma unroll 4
      for (int ii = 0; ii < kTile; ++ii) {
        if (ii < a || ii > b || ls[ii] == -INFINITY) continue;
        const float p = expf(d.scale * dot(kr, qs[ii]) - ls[ii]);
        const float ds = d.scale * (p * (dot(vr, gs[ii]) - ds_[ii]));
#pragma unroll
        for (int c = 0; c < DT; ++c) {
          av[c] = fmaf(p, gs[ii][c], av[c]);
          ak[c] = fmaf(ds, qs[ii][c], ak[c]);
        }
      }
    }
  if (!row) return;
  float* ok = dk + w * d.D;
  float* ov = dv + w * d.Dv;
#pragma unroll
  for (int c = 0; c < DT; ++c) {
    if (c < d.D) ok[c] = d.acc ? ok[c] + ak[c] : ak[c];
    if (c < d.Dv) ov[c] = d.acc ? ov[c] + av[c] : av[c];
  }
}

// Which kernels a call runs: the tiled ones where both head dims fit 32 or 64 (their
// register rows), the simple ones otherwise or where PEAKBOUND_CUDA_ATTENTION=simple
// asks for them (for comparing the two on a GPU).
int tiled_dim(const AttentionDims& a) {
  static const bool simple = [] {
    const char* e = std::getenv("PEAKBOUND_CUDA_ATTENTION");
    return e && std::string(e) == "simple";
  }();
  if (simple) return 0;
  const std::int64_t m = a.qk_dim > a.v_dim ? a.qk_dim : a.v_dim;
  return m <= 32 ? 32 : m <= 64 ? 64 : 0;
}

dim3 row_grid(std::int64_t rows, std::int64_t heads) {
  const std::int64_t b = (rows + kRows - 1) / kRows;
  if (b > 0x7fffffff || heads > 65535)
    throw InvalidArgument("cuda attention: " + std::to_string(rows) + " rows of " + std::to_string(heads) +
                          " heads exceed one grid");
  return dim3(static_cast<unsigned>(b), static_cast<unsigned>(heads));
}

// The tiled kernels' launches at one register width DT.
template <typename T, int DT>
void forward_tiled(void* s, float* out, float* lse, const T* q, const T* k, const T* v, const AttentionDims& a) {
  forward_tiled_k<T, DT><<<row_grid(a.tokens, a.q_heads), kRows, 0, native(s)>>>(out, lse, q, k, v, dims_of(a));
}
template <typename T, int DT>
void backward_tiled(void* s, float* dq, float* dk, float* dv, const T* dout, const T* q, const T* k, const T* v,
                    const float* lse, const float* row_dot, const AttentionDims& a) {
  const Dims d = dims_of(a);
  backward_dq_tiled_k<T, DT><<<row_grid(a.tokens, a.q_heads), kRows, 0, native(s)>>>(dq, dout, q, k, v, lse, row_dot,
                                                                                      d);
  check_launch("attention_backward");
  backward_dkv_tiled_k<T, DT><<<row_grid(a.key_tokens(), a.kv_heads), kRows, 0, native(s)>>>(dk, dv, dout, q, k, v,
                                                                                              lse, row_dot, d);
}

void check(const AttentionDims& a) {
  check_attention_dims(a);
  if (a.qk_dim > kMaxHeadDim || a.v_dim > kMaxHeadDim)
    throw InvalidArgument("cuda attention: head dims " + std::to_string(a.qk_dim) + "/" + std::to_string(a.v_dim) +
                          " above the kernel's " + std::to_string(kMaxHeadDim));
}

unsigned warp_blocks(std::int64_t warps) {
  const std::int64_t b = (warps + kWarps - 1) / kWarps;
  if (b > 0x7fffffff) throw InvalidArgument("cuda attention: " + std::to_string(warps) + " rows exceed one grid");
  return static_cast<unsigned>(b);
}

template <typename T>
void forward_launch(void* s, float* out, float* lse, const T* q, const T* k, const T* v, const AttentionDims& a) {
  check(a);
  switch (tiled_dim(a)) {
    case 32: forward_tiled<T, 32>(s, out, lse, q, k, v, a); break;
    case 64: forward_tiled<T, 64>(s, out, lse, q, k, v, a); break;
    default:
      forward_k<T><<<warp_blocks(a.tokens * a.q_heads), kWarps * 32, 0, native(s)>>>(out, lse, q, k, v, dims_of(a));
  }
  check_launch("attention_forward");
}

template <typename T>
void row_dot_launch(void* s, float* row_dot, const T* dout, const T* out, const AttentionDims& a) {
  check(a);
  row_dot_k<T><<<warp_blocks(a.tokens * a.q_heads), kWarps * 32, 0, native(s)>>>(row_dot, dout, out, dims_of(a));
  check_launch("attention_row_dot");
}

template <typename T>
void backward_launch(void* s, float* dq, float* dk, float* dv, const T* dout, const T* q, const T* k, const T* v,
                     const T* out, const float* lse, const AttentionDims& a, float* workspace, const float* row_dot) {
  check(a);
  const Dims d = dims_of(a);
  if (!row_dot) {
    row_dot_k<T><<<warp_blocks(a.tokens * a.q_heads), kWarps * 32, 0, native(s)>>>(workspace, dout, out, d);
    check_launch("attention_backward");
    row_dot = workspace;
  }
  switch (tiled_dim(a)) {
    case 32: backward_tiled<T, 32>(s, dq, dk, dv, dout, q, k, v, lse, row_dot, a); break;
    case 64: backward_tiled<T, 64>(s, dq, dk, dv, dout, q, k, v, lse, row_dot, a); break;
    default:
      backward_dq_k<T><<<warp_blocks(a.tokens * a.q_heads), kWarps * 32, 0, native(s)>>>(dq, dout, q, k, v, lse,
                                                                                        row_dot, d);
      check_launch("attention_backward");
      backward_dkv_k<T><<<warp_blocks(a.key_tokens() * a.kv_heads), kWarps * 32, 0, native(s)>>>(dk, dv, dout, q, k,
                                                                                                v, lse, row_dot, d);
  }
  check_launch("attention_backward");
}

}  // namespace

void attention_forward(void* s, float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a) {
  forward_launch(s, out, lse, q, k, v, a);
}
void attention_forward(void* s, float* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const AttentionDims& a) {
  forward_launch(s, out, lse, q, k, v, a);
}

void attention_row_dot(void* s, float* row_dot, const float* dout, const float* out, const AttentionDims& a) {
  row_dot_launch(s, row_dot, dout, out, a);
}
void attention_row_dot(void* s, float* row_dot, const bf16* dout, const bf16* out, const AttentionDims& a) {
  row_dot_launch(s, row_dot, dout, out, a);
}

void attention_backward(void* s, float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const AttentionDims& a,
                        float* workspace, const float* row_dot) {
  backward_launch(s, dq, dk, dv, dout, q, k, v, out, lse, a, workspace, row_dot);
}
void attention_backward(void* s, float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, const AttentionDims& a, float* workspace,
                        const float* row_dot) {
  backward_launch(s, dq, dk, dv, dout, q, k, v, out, lse, a, workspace, row_dot);
}

}  // namespace peakbound::cuda
