// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13), and -Wuninitialized where the vectors sit in an
// array (the tile transpose); both warnings are off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "peakbound/kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/adamw_types.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/kernels/cpu/vexp.h"

namespace peakbound::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows whose softmax rescale factors the forward computes in one vector exp.
constexpr std::int64_t kRowGroup = 16;
// The most query rows a block the bf16 backward runs transposed (their lse and D on the
// stack); larger blocks run row-major.
constexpr std::int64_t kTransposedRows = 512;

// a . b in a fixed order: eight interleaved partial sums (independent chains the
// compiler can keep in vector registers without -ffast-math), then a fixed tree.
inline float dot(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// a . b accumulated in double, rounded once: D_i is subtracted from every dP_ij, and
// dP_ij - D_i cancels (exactly, on the diagonal of a row that sees one key), so D_i
// carries no rounding of its own beyond the final one.
template <typename T>
inline float dot_f64(const T* a, const T* b, std::int64_t n) {
  double acc = 0.0;
  for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(widen(a[i])) * widen(b[i]);
  return static_cast<float>(acc);
}

// ds[c] = p[c] * (ds[c] - d[c * d_step]) * scale for c in [0, n): dL/dscore (times the
// score scale) from P and dP, d one value (d_step 0: a query row's D) or one per element
// (d_step 1: a key row's queries' D); with `low` also low[c] = ds[c] rounded to bf16, the
// rounded operand of the gradient GEMMs: packed (bf16), or held in fp32 (float, which may
// be ds itself: the convert path's operand, bf16_lanes.h's store_rounded). The AVX-512 body
// does the same two products per element (no FMA), so its bits are the scalar loop's.
template <typename L>
void grad_scores_scalar(float* ds, const float* p, const float* d, std::int64_t d_step, float scale, std::int64_t n,
                        L* low) {
  for (std::int64_t c = 0; c < n; ++c) {
    ds[c] = p[c] * (ds[c] - d[c * d_step]) * scale;
    if (low) simd::store_rounded(low + c, ds[c]);
  }
}

template <typename L>
__attribute__((target("avx512f"))) void grad_scores_avx512(float* ds, const float* p, const float* d,
                                                            std::int64_t d_step, float scale, std::int64_t n,
                                                            L* low) {
  const __m512 vs = _mm512_set1_ps(scale);
  std::int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 vd = d_step ? _mm512_loadu_ps(d + c) : _mm512_set1_ps(*d);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + c), _mm512_sub_ps(_mm512_loadu_ps(ds + c), vd)), vs);
    _mm512_storeu_ps(ds + c, v);
    if (low) simd::store_rounded16(low + c, v);
  }
  grad_scores_scalar(ds + c, p + c, d + c * d_step, d_step, scale, n - c, low ? low + c : nullptr);
}

// The same with the rounding by VCVTNEPS2BF16 (to_bf16x16's bits), where the CPU has it
// (a copy for its target, as vexp.cc's blocks_avx512_bf16).
template <typename L>
__attribute__((target("avx512f,avx512dq,avx512bf16"))) void grad_scores_avx512_bf16(float* ds, const float* p,
                                                                                     const float* d,
                                                                                     std::int64_t d_step, float scale,
                                                                                     std::int64_t n, L* low) {
  const __m512 vs = _mm512_set1_ps(scale);
  std::int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 vd = d_step ? _mm512_loadu_ps(d + c) : _mm512_set1_ps(*d);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + c), _mm512_sub_ps(_mm512_loadu_ps(ds + c), vd)), vs);
    _mm512_storeu_ps(ds + c, v);
    simd::store_rounded16_native(low + c, v);
  }
  grad_scores_scalar(ds + c, p + c, d + c * d_step, d_step, scale, n - c, low + c);
}

template <typename L>
void grad_scores(float* ds, const float* p, const float* d, std::int64_t d_step, float scale, std::int64_t n,
                 L* low) {
  static const bool avx512 = best_simd_level() == SimdLevel::avx512;
  static const bool native = avx512 && simd::cpu_has_avx512_bf16();
  if (native && low) grad_scores_avx512_bf16(ds, p, d, d_step, scale, n, low);
  else if (avx512) grad_scores_avx512(ds, p, d, d_step, scale, n, low);
  else grad_scores_scalar(ds, p, d, d_step, scale, n, low);
}

// The rows [lo, hi) of a query tile (query r at position first + r, `rows` of them) that
// see key position j: causal (query >= j), and inside the sliding window when there is one
// (query < j + window): visible_columns turned around, the same (query, key) pairs.
struct VisibleRows {
  std::int64_t lo, hi;
};
inline VisibleRows visible_rows(std::int64_t j, std::int64_t first, std::int64_t rows, std::int64_t window) {
  const std::int64_t lo = std::clamp<std::int64_t>(j - first, 0, rows);
  const std::int64_t hi = window == 0 ? rows : std::clamp<std::int64_t>(j + window - first, lo, rows);
  return {lo, hi};
}

// The columns [lo, hi) of a key tile (key c at position first + c, `cols` of them) that
// query position i sees: causal (key <= i), and inside the sliding window when there is
// one (key > i - window). Empty (lo == hi) when none.
struct Visible {
  std::int64_t lo, hi;
};
inline Visible visible_columns(std::int64_t i, std::int64_t first, std::int64_t cols, std::int64_t window) {
  const std::int64_t hi = std::clamp<std::int64_t>(i - first + 1, 0, cols);
  const std::int64_t lo = window == 0 ? 0 : std::clamp<std::int64_t>(i - window + 1 - first, 0, hi);
  return {lo, hi};
}

// Runs share(slot) for slot in [0, slots): on the pool, or in order on the caller. Each
// share owns fixed work and workspace slot, so the result is the same either way.
template <class F>
void run_shares(int slots, ThreadPool* pool, const F& share) {
  if (pool != nullptr && slots > 1) {
    pool->parallel_for(slots, [&](std::int64_t s) { share(s); });
  } else {
    for (int s = 0; s < slots; ++s) share(s);
  }
}

// The tile products: sgemm on f32 storage; on bf16 storage the bf16 GEMM on `path`
// (fp32 accumulation into the f32 C either way).
inline void tile_gemm(Bf16GemmPath, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                      const float* x, std::int64_t ldx, const float* y, std::int64_t ldy, float beta, float* c,
                      std::int64_t ldc) {
  gemm_f32(ta, tb, m, n, k, alpha, x, ldx, y, ldy, beta, c, ldc);
}
inline void tile_gemm(Bf16GemmPath path, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                      const bf16* x, std::int64_t ldx, const bf16* y, std::int64_t ldy, float beta, float* c,
                      std::int64_t ldc) {
  gemm_bf16(path, ta, tb, m, n, k, alpha, x, ldx, y, ldy, beta, c, ldc);
}

// The convert path's operands widened once (kernels/cpu/gemm_bf16.h: convert widens each
// block of A and B to f32 and calls sgemm). A tile product there widened both of its
// operands on every call, so the backward widened Q, K, dO and dS twice a block and the
// forward Q once for every key block: 10 tile widenings a backward block, 4 a forward one.
// With head dim 32 the widening was most of what made the bf16 kernel slower than the f32
// one. Here each operand is widened once, into the dense layout gemm_convert widens into,
// and the products are the sgemm calls gemm_convert makes (same shapes, transposes and
// leading dimensions), with one change: the score products S = Q K^T and dP = dO V^T take
// K and V widened transposed ([D, keys]) and run as row-major NN products, not NT.
// OpenBLAS 0.3.21 sends a row-major NT product of these shapes (128 x 128 x 32) through
// its packed kernel, with a memset of C for beta 0, and an NN one through its small-matrix
// kernel: 10.5 -> 6.7 us at 128 x 128 x 32 on one core of an Emerald Rapids Xeon. Both sum
// each element's products in K order by FMA and then scale by alpha, so on whole tiles the
// bits are gemm_convert's (tests: ConvertWidensEachOperandOnceWithTheSameBits; measured
// equal on the Cooperlake, SkylakeX, Haswell and Zen kernels at 128 x 128, 100 x 77 and
// 45 x 45). On tiles cut short (by the end of the queries or keys, or the causal edge) the
// two kernels can treat the edges differently: on the Cooperlake kernels 128 rows against
// 9, 20, 34-40 or 100 keys, or 2-9 rows against most widths, differ in the last bit of some
// scores (the main job's and 2 ranks x 4096's losses did not move; the 832-token cp-4 run's
// 30-step loss went 4.183793700259665 -> 4.181294008153648). The products hold while every
// dimension is one of gemm_convert's blocks (at most kWideMax): larger tiles or heads take
// the generic route. The f32 kernel takes the same NN score products on K and V transposed
// into kt and vt (and its other operands in place), with the same bits on the same tiles.
constexpr std::int64_t kWideMax = 512;
struct Wide {
  // this thread's widened tiles (fixed size, reused); kt and vt: K and V transposed; p:
  // the backward's rounded P (the forward's, and dS, are rounded in place in fp32)
  std::vector<float> q, k, v, kt, vt, d_o, p;
};
Wide& wide_tiles() {
  thread_local Wide w;
  return w;
}
// rows x cols of bf16 (row stride ld) into a dense f32 buffer (grown, never shrunk).
const float* widen_tile(std::vector<float>& buf, const bf16* x, std::int64_t ld, std::int64_t rows,
                        std::int64_t cols) {
  if (buf.size() < static_cast<std::size_t>(rows * cols)) buf.resize(static_cast<std::size_t>(rows * cols));
  widen_bf16_block(x, ld, rows, cols, buf.data());
  return buf.data();
}

// 16 x 16 of x (row stride ld; bf16 widened, or f32) transposed into out (row stride ldo):
// 16 rows as 32-bit lanes, then the usual 4-stage transpose (32-bit and 64-bit interleaves
// within 128-bit lanes, then two rounds of 128-bit lane shuffles). Data movement: exact.
__attribute__((target("avx512f"))) inline __m512i lanes16(const bf16* x) {
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16);
}
__attribute__((target("avx512f"))) inline __m512i lanes16(const float* x) { return _mm512_loadu_si512(x); }
template <typename T>
__attribute__((target("avx512f"))) void transpose16_avx512(const T* x, std::int64_t ld, float* out, std::int64_t ldo) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = lanes16(x + i * ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // r[4g + m]: column 4l + m of rows 4g..4g+3, in 128-bit lane l.
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88), w0 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xDD);
    const __m512i v1 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88),
                  w1 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xDD);
    _mm512_storeu_si512(out + (0 + m) * ldo, _mm512_shuffle_i32x4(v0, v1, 0x88));
    _mm512_storeu_si512(out + (4 + m) * ldo, _mm512_shuffle_i32x4(w0, w1, 0x88));
    _mm512_storeu_si512(out + (8 + m) * ldo, _mm512_shuffle_i32x4(v0, v1, 0xDD));
    _mm512_storeu_si512(out + (12 + m) * ldo, _mm512_shuffle_i32x4(w0, w1, 0xDD));
  }
}

// rows x cols of T (row stride ld) into a dense f32 [cols, rows] (bf16 widened): K or V of a
// key block as the B of a row-major NN score product.
template <typename T>
const float* widen_tile_t(std::vector<float>& buf, const T* x, std::int64_t ld, std::int64_t rows,
                          std::int64_t cols) {
  if (buf.size() < static_cast<std::size_t>(rows * cols)) buf.resize(static_cast<std::size_t>(rows * cols));
  float* out = buf.data();
  static const bool avx512 = best_simd_level() == SimdLevel::avx512;
  const std::int64_t rf = avx512 ? rows / 16 * 16 : 0, cf = avx512 ? cols / 16 * 16 : 0;
  for (std::int64_t r0 = 0; r0 < rf; r0 += 16)
    for (std::int64_t c0 = 0; c0 < cf; c0 += 16) transpose16_avx512(x + r0 * ld + c0, ld, out + c0 * rows + r0, rows);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = r < rf ? cf : 0; c < cols; ++c) out[c * rows + r] = widen(x[r * ld + c]);
  return out;
}
bool wide_fits(const AttentionDims& a) {
  return a.block_q <= kWideMax && a.block_k <= kWideMax && a.qk_dim <= kWideMax && a.v_dim <= kWideMax;
}

// Floats a slot's bf16 copy of a [Bq, Bk] tile takes (two a float, rounded up; none for
// f32, whose P and dS are used in place): kernels/attention_dims.cc's sizes.
template <typename T>
constexpr std::int64_t low_tile_floats(std::int64_t n) {
  return std::is_same_v<T, float> ? 0 : (n + 1) / 2;
}

template <typename T>
void row_dot_impl(float* row_dot, const T* dout, const T* out, const AttentionDims& a) {
  const std::int64_t rows = a.tokens * a.q_heads, Dv = a.v_dim;
  for (std::int64_t x = 0; x < rows; ++x) row_dot[x] = dot_f64(dout + x * Dv, out + x * Dv, Dv);
}

// The forward over storage T of q, k, v (out, lse fp32). T = float is the f32 kernel
// bit for bit (path unused); T = bf16 runs the tile products on the bf16 GEMM with P
// rounded to bf16 for O += P V, the softmax statistics and the sum l in fp32 from the
// unrounded P, as FlashAttention-2 does.
template <typename T>
void forward_impl(float* out, float* lse, const T* q, const T* k, const T* v, const AttentionDims& a,
                  float* workspace, ThreadPool* pool, Bf16GemmPath path) {
  check_attention_dims(a);
  const std::int64_t Tq = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  // Global positions: query row i is qo + i, key row j is ko + j.
  const std::int64_t qo = a.q_offset, ko = a.k_offset;
  const float scale = a.effective_scale();
  const std::int64_t q_blocks = (Tq + Bq - 1) / Bq, items = Hq * q_blocks;
  const std::int64_t slot_floats = Bq * Bk + 2 * Bq + low_tile_floats<T>(Bq * Bk);
  constexpr bool kLow = !std::is_same_v<T, float>;  // P rounded into `low` (bf16)
  // S = Q K^T as an NN product on K transposed (Wide's kt): f32 (Q read in place), and bf16
  // on the convert path (Q widened once an item, V once a key block).
  const bool nn = wide_fits(a) && (!kLow || path == Bf16GemmPath::convert);

  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* S = workspace + slot * slot_floats;  // [Bq, Bk] scores, then probabilities
    float* m = S + Bq * Bk;                     // [Bq] running max
    float* l = m + Bq;                          // [Bq] running sum of exp(s - m)
    float* low = l + Bq;                        // bf16 only: [Bq, Bk] P rounded
    for (std::int64_t item = slot; item < items; item += a.threads) {
      const std::int64_t h = item / q_blocks, g = h / group;
      const std::int64_t i0 = (item % q_blocks) * Bq, i1 = std::min(i0 + Bq, Tq), rows = i1 - i0;
      float* o_tile = out + (i0 * Hq + h) * Dv;  // rows of stride Hq * Dv
      for (std::int64_t r = 0; r < rows; ++r) {
        float* oi = o_tile + r * Hq * Dv;
        // A running row restarts from its normalised output: m = lse, l = 1.
        const float prev = a.accumulate ? lse[(i0 + r) * Hq + h] : kNegInf;
        m[r] = prev;
        l[r] = prev == kNegInf ? 0.0f : 1.0f;
        if (prev == kNegInf) std::fill_n(oi, Dv, 0.0f);
      }
      // Keys the tile sees: [first visible to row i0, last visible to row i1 - 1], on
      // the Bk grid from key row 0; none when the block lies after the tile.
      const auto [k_lo, k_hi] = attention_forward_keys(a, i0, i1);
      Wide* wt = nullptr;         // bf16 on the convert path: the widened tiles
      const float* qf = nullptr;  // the NN route's Q tile, rows of stride ldq
      std::int64_t ldq = D;
      if (nn && k_lo < k_hi) {
        if constexpr (kLow) {
          wt = &wide_tiles();
          qf = widen_tile(wt->q, q + (i0 * Hq + h) * D, Hq * D, rows, D);
        } else {
          qf = q + (i0 * Hq + h) * D;
          ldq = Hq * D;
        }
      }
      for (std::int64_t j0 = k_lo / Bk * Bk; k_lo < k_hi && j0 < k_hi; j0 += Bk) {
        const std::int64_t cols = std::min(j0 + Bk, k_hi) - j0;
        // S = scale * Q_tile K_tile^T: an NN product on K transposed into a per-thread tile
        // (Wide; f32 and the convert path), else an NT one over strided rows.
        const float* vf = nullptr;
        if (qf != nullptr) {
          const float* kt = widen_tile_t(wide_tiles().kt, k + (j0 * Hkv + g) * D, Hkv * D, cols, D);
          if constexpr (kLow) vf = widen_tile(wt->v, v + (j0 * Hkv + g) * Dv, Hkv * Dv, cols, Dv);
          gemm_f32(false, false, rows, cols, D, scale, qf, ldq, kt, cols, 0.0f, S, Bk);
        } else {
          tile_gemm(path, false, true, rows, cols, D, scale, q + (i0 * Hq + h) * D, Hq * D, k + (j0 * Hkv + g) * D,
                    Hkv * D, 0.0f, S, Bk);
        }
        // Rows in groups of kRowGroup: the group's maxima first, then its rescale factors
        // alpha = exp(m_old - m_new) in one vector call (exp_f32's bits), then each row's
        // probabilities. Only the visible columns count: the rest of a row becomes 0. Under
        // bf16 the probabilities go straight into the rounded tile (P's fp32 values are
        // needed only for the sum l, which exp_shift_sum takes before rounding).
        for (std::int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
          const std::int64_t rn = std::min(kRowGroup, rows - r0);
          float most[kRowGroup], alpha[kRowGroup];
          Visible vis[kRowGroup];
          for (std::int64_t x = 0; x < rn; ++x) {
            vis[x] = visible_columns(qo + i0 + r0 + x, ko + j0, cols, W);
            most[x] = row_max(S + (r0 + x) * Bk + vis[x].lo, vis[x].hi - vis[x].lo);
            // 0 on the row's first tile (m_old = -inf); a row without keys here takes 1.
            alpha[x] = most[x] == kNegInf ? 0.0f : m[r0 + x] - std::max(m[r0 + x], most[x]);
          }
          exp_shift(alpha, rn, 0.0f);
          for (std::int64_t x = 0; x < rn; ++x) {
            const std::int64_t r = r0 + x, lo = vis[x].lo, hi = vis[x].hi;
            float* s = S + r * Bk;
            if (most[x] == kNegInf) {  // nothing of this row in this key tile: adds zeros
              if (wt != nullptr) std::fill_n(s, cols, 0.0f);
              else if constexpr (kLow) std::fill_n(reinterpret_cast<T*>(low) + r * Bk, cols, T{});
              else std::fill_n(s, cols, 0.0f);
              continue;
            }
            const float m_new = std::max(m[r], most[x]);
            if (alpha[x] != 1.0f) {
              float* oi = o_tile + r * Hq * Dv;
              for (std::int64_t d = 0; d < Dv; ++d) oi[d] *= alpha[x];
            }
            float e;
            if (wt != nullptr) {  // rounded in place, in fp32 (the convert path's operand)
              std::fill_n(s, lo, 0.0f);
              std::fill(s + hi, s + cols, 0.0f);
              e = exp_shift_sum(s + lo, s + lo, hi - lo, m_new);
            } else if constexpr (kLow) {
              T* p = reinterpret_cast<T*>(low) + r * Bk;
              std::fill_n(p, lo, T{});
              std::fill(p + hi, p + cols, T{});
              e = exp_shift_sum(p + lo, s + lo, hi - lo, m_new);
            } else {
              std::fill_n(s, lo, 0.0f);
              std::fill(s + hi, s + cols, 0.0f);
              e = exp_shift_sum(s + lo, hi - lo, m_new);
            }
            l[r] = l[r] * alpha[x] + e;
            m[r] = m_new;
          }
        }
        // O_tile += P V_tile
        const T* P = kLow ? reinterpret_cast<const T*>(low) : reinterpret_cast<const T*>(S);
        if (vf != nullptr) {
          gemm_f32(false, false, rows, Dv, cols, 1.0f, S, Bk, vf, Dv, 1.0f, o_tile, Hq * Dv);
        } else {
          tile_gemm(path, false, false, rows, Dv, cols, 1.0f, P, Bk, v + (j0 * Hkv + g) * Dv, Hkv * Dv, 1.0f, o_tile,
                    Hq * Dv);
        }
      }
      // A row that saw no key at all (l == 0) keeps out 0 and lse -inf.
      for (std::int64_t r = 0; r < rows; ++r) {
        float* oi = o_tile + r * Hq * Dv;
        if (l[r] == 0.0f) {
          lse[(i0 + r) * Hq + h] = kNegInf;
          continue;
        }
        if (l[r] != 1.0f)
          for (std::int64_t d = 0; d < Dv; ++d) oi[d] /= l[r];
        lse[(i0 + r) * Hq + h] = m[r] + std::log(l[r]);
      }
    }
  });
}

// The backward over storage T of dout, q, k, v, out (lse, row_dot, dq, dk, dv fp32).
// T = float is the f32 kernel bit for bit; T = bf16 recomputes P and dP on the bf16
// GEMM, forms dS in fp32 from the unrounded P, and rounds P (for dV) and dS (for dK,
// dQ) to bf16 for the gradient products, which accumulate in fp32 into dq, dk, dv.
template <typename T>
void backward_impl(float* dq, float* dk, float* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                   const float* lse, const AttentionDims& a, float* workspace, ThreadPool* pool, const float* row_dot,
                   Bf16GemmPath path) {
  check_attention_dims(a);
  const std::int64_t Tq = a.tokens, Tk = a.key_tokens(), Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  const std::int64_t qo = a.q_offset, ko = a.k_offset;
  const float scale = a.effective_scale();
  // D_i = rowsum(dout * out) [T, Hq]: the caller's, or computed into the workspace.
  float* own_di = row_dot != nullptr ? nullptr : workspace;
  const float* Di = row_dot != nullptr ? row_dot : own_di;
  float* tiles = row_dot != nullptr ? workspace : workspace + Tq * Hq;
  const std::int64_t low = low_tile_floats<T>(Bq * Bk);
  constexpr bool kLow = !std::is_same_v<T, float>;  // P and dS rounded into P_low, dS_low (bf16)
  // bf16 on the convert path: K and V widened once a key block, Q and dO once a tile, P and
  // dS once each (Wide).
  // P = Q K^T and dP = dO V^T as NN products on K and V transposed once a key block (Wide's
  // kt, vt): f32 (Q, dO read in place), and bf16 on the convert path (also K widened once a
  // key block, Q and dO once a tile, P and dS rounded in fp32).
  const bool nn = wide_fits(a) && (!kLow || path == Bf16GemmPath::convert);

  // One share per kv head (strided): it owns dk and dv of that head and dq of its query
  // heads, so no two shares write the same element and no reduction is needed.
  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* P = tiles + slot * 2 * (Bq * Bk + low);  // [Bq, Bk] probabilities
    float* dS = P + Bq * Bk;                         // [Bq, Bk] dP, then scale * dL/dscore
    float* P_low = dS + Bq * Bk;                     // bf16 only: [Bq, Bk] P rounded
    float* dS_low = P_low + low;                     // bf16 only: [Bq, Bk] dS rounded
    for (std::int64_t g = slot; g < Hkv; g += a.threads) {
      const std::int64_t h_lo = g * group, h_hi = h_lo + group;
      for (std::int64_t i = 0; i < Tq; ++i)
        for (std::int64_t h = h_lo; h < h_hi; ++h) {
          if (own_di != nullptr) own_di[i * Hq + h] = dot_f64(dout + (i * Hq + h) * Dv, out + (i * Hq + h) * Dv, Dv);
          if (!a.accumulate) std::fill_n(dq + (i * Hq + h) * D, D, 0.0f);
        }
      if (!a.accumulate)
        for (std::int64_t j = 0; j < Tk; ++j) {
          std::fill_n(dk + (j * Hkv + g) * D, D, 0.0f);
          std::fill_n(dv + (j * Hkv + g) * Dv, Dv, 0.0f);
        }
      for (std::int64_t j0 = 0; j0 < Tk; j0 += Bk) {
        const std::int64_t cols = std::min(j0 + Bk, Tk) - j0;
        const T* k_tile = k + (j0 * Hkv + g) * D;
        const T* v_tile = v + (j0 * Hkv + g) * Dv;
        float* dk_tile = dk + (j0 * Hkv + g) * D;
        float* dv_tile = dv + (j0 * Hkv + g) * Dv;
        // Query rows that see some key of this tile: from the tile's first key's
        // position to its last key's position + W (exclusive), clipped to [0, T).
        const auto [q_lo, q_hi] = attention_backward_queries(a, j0, cols);
        Wide* wt = nullptr;
        const float *kf = nullptr, *kt = nullptr, *vt = nullptr;
        if (nn && q_lo < q_hi) {
          kt = widen_tile_t(wide_tiles().kt, k_tile, Hkv * D, cols, D);
          vt = widen_tile_t(wide_tiles().vt, v_tile, Hkv * Dv, cols, Dv);
          if constexpr (kLow) {
            wt = &wide_tiles();
            kf = widen_tile(wt->k, k_tile, Hkv * D, cols, D);
            if (wt->p.size() < static_cast<std::size_t>(Bq * Bk)) wt->p.resize(static_cast<std::size_t>(Bq * Bk));
          }
        }
        for (std::int64_t h = h_lo; h < h_hi; ++h) {
          for (std::int64_t i0 = q_lo / Bq * Bq; q_lo < q_hi && i0 < q_hi; i0 += Bq) {
            const std::int64_t rows = std::min(i0 + Bq, q_hi) - i0;
            const T* q_tile = q + (i0 * Hq + h) * D;
            const T* do_tile = dout + (i0 * Hq + h) * Dv;
            if constexpr (kLow) {
              if (path != Bf16GemmPath::convert && rows <= kTransposedRows) {
                // The block transposed: P^T = exp(scale K Q^T - lse) and dP^T = V dO^T, a
                // key row at a time, so that dV += P^T dO and dK += dS^T Q read their A
                // in place and only dQ += dS K transposes it. The tile products multiply
                // the same pairs in the same order (the amx and native kernels' dot
                // products are symmetric in their operands), and every element takes the
                // same operations, so the bits are the row-major form's. (The convert
                // path's sgemm may sum a transposed product in another order: not there.)
                float lse_r[kTransposedRows], d_r[kTransposedRows];
                for (std::int64_t r = 0; r < rows; ++r) {
                  lse_r[r] = lse[(i0 + r) * Hq + h];
                  d_r[r] = Di[(i0 + r) * Hq + h];
                }
                auto* pt_low = reinterpret_cast<bf16*>(P_low);
                auto* dst_low = reinterpret_cast<bf16*>(dS_low);
                tile_gemm(path, false, true, cols, rows, D, scale, k_tile, Hkv * D, q_tile, Hq * D, 0.0f, P, Bq);
                tile_gemm(path, false, true, cols, rows, Dv, 1.0f, v_tile, Hkv * Dv, do_tile, Hq * Dv, 0.0f, dS, Bq);
                for (std::int64_t c = 0; c < cols; ++c) {
                  float* p = P + c * Bq;
                  bf16* pl = pt_low + c * Bq;
                  const auto [lo, hi] = visible_rows(ko + j0 + c, qo + i0, rows, W);
                  std::fill_n(p, lo, 0.0f);
                  std::fill(p + hi, p + rows, 0.0f);
                  std::fill_n(pl, lo, bf16{});
                  std::fill(pl + hi, pl + rows, bf16{});
                  exp_shifts(p + lo, pl + lo, hi - lo, lse_r + lo);
                  grad_scores(dS + c * Bq, p, d_r, 1, scale, rows, dst_low + c * Bq);
                }
                tile_gemm(path, false, false, cols, Dv, rows, 1.0f, pt_low, Bq, do_tile, Hq * Dv, 1.0f, dv_tile,
                          Hkv * Dv);
                tile_gemm(path, false, false, cols, D, rows, 1.0f, dst_low, Bq, q_tile, Hq * D, 1.0f, dk_tile,
                          Hkv * D);
                tile_gemm(path, true, false, rows, D, cols, 1.0f, dst_low, Bq, k_tile, Hkv * D, 1.0f,
                          dq + (i0 * Hq + h) * D, Hq * D);
                continue;
              }
            }
            // P = exp(scale Q K^T - lse) (0 where masked), dP = dO V^T.
            const float *qf = nullptr, *dof = nullptr;
            if constexpr (kLow) {
              if (wt != nullptr) {
                qf = widen_tile(wt->q, q_tile, Hq * D, rows, D);
                dof = widen_tile(wt->d_o, do_tile, Hq * Dv, rows, Dv);
              }
            } else {
              qf = kt != nullptr ? q_tile : nullptr;
              dof = do_tile;
            }
            if (qf != nullptr) {
              const std::int64_t ldq = kLow ? D : Hq * D, ldo = kLow ? Dv : Hq * Dv;
              gemm_f32(false, false, rows, cols, D, scale, qf, ldq, kt, cols, 0.0f, P, Bk);
              gemm_f32(false, false, rows, cols, Dv, 1.0f, dof, ldo, vt, cols, 0.0f, dS, Bk);
            } else {
              tile_gemm(path, false, true, rows, cols, D, scale, q_tile, Hq * D, k_tile, Hkv * D, 0.0f, P, Bk);
              tile_gemm(path, false, true, rows, cols, Dv, 1.0f, do_tile, Hq * Dv, v_tile, Hkv * Dv, 0.0f, dS, Bk);
            }
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              const float lse_i = lse[i * Hq + h], d_i = Di[i * Hq + h];
              float* p = P + r * Bk;
              float* ds = dS + r * Bk;
              // P = 0 where the key is not visible (a row that sees none has lse -inf).
              const auto [lo, hi] = visible_columns(qo + i, ko + j0, cols, W);
              std::fill_n(p, lo, 0.0f);
              std::fill(p + hi, p + cols, 0.0f);
              if (wt != nullptr) {  // P rounded into wt->p, dS in place, both in fp32
                float* pl = wt->p.data() + r * Bk;
                std::fill_n(pl, lo, 0.0f);
                std::fill(pl + hi, pl + cols, 0.0f);
                exp_shift(p + lo, pl + lo, hi - lo, lse_i);
                grad_scores(ds, p, &d_i, 0, scale, cols, ds);
              } else if constexpr (kLow) {  // P and dS rounded as they are made
                bf16* pl = reinterpret_cast<bf16*>(P_low) + r * Bk;
                std::fill_n(pl, lo, bf16{});
                std::fill(pl + hi, pl + cols, bf16{});
                exp_shift(p + lo, pl + lo, hi - lo, lse_i);
                grad_scores(ds, p, &d_i, 0, scale, cols, reinterpret_cast<bf16*>(dS_low) + r * Bk);
              } else {
                exp_shift(p + lo, hi - lo, lse_i);
                grad_scores<bf16>(ds, p, &d_i, 0, scale, cols, nullptr);
              }
            }
            // dV_tile += P^T dO, dK_tile += dS^T Q, dQ_tile += dS K.
            const T* Pt = kLow ? reinterpret_cast<const T*>(P_low) : reinterpret_cast<const T*>(P);
            const T* dSt = kLow ? reinterpret_cast<const T*>(dS_low) : reinterpret_cast<const T*>(dS);
            if constexpr (kLow) {
              if (qf != nullptr) {  // P and dS rounded in fp32, [rows, cols] of row stride Bk
                const float* pf = wt->p.data();
                gemm_f32(true, false, cols, Dv, rows, 1.0f, pf, Bk, dof, Dv, 1.0f, dv_tile, Hkv * Dv);
                gemm_f32(true, false, cols, D, rows, 1.0f, dS, Bk, qf, D, 1.0f, dk_tile, Hkv * D);
                gemm_f32(false, false, rows, D, cols, 1.0f, dS, Bk, kf, D, 1.0f, dq + (i0 * Hq + h) * D, Hq * D);
                continue;
              }
            }
            tile_gemm(path, true, false, cols, Dv, rows, 1.0f, Pt, Bk, do_tile, Hq * Dv, 1.0f, dv_tile, Hkv * Dv);
            tile_gemm(path, true, false, cols, D, rows, 1.0f, dSt, Bk, q_tile, Hq * D, 1.0f, dk_tile, Hkv * D);
            tile_gemm(path, false, false, rows, D, cols, 1.0f, dSt, Bk, k_tile, Hkv * D, 1.0f, dq + (i0 * Hq + h) * D,
                      Hq * D);
          }
        }
      }
    }
  });
}

}  // namespace

void attention_row_dot(float* row_dot, const float* dout, const float* out, const AttentionDims& a) {
  row_dot_impl(row_dot, dout, out, a);
}

void attention_row_dot(float* row_dot, const bf16* dout, const bf16* out, const AttentionDims& a) {
  row_dot_impl(row_dot, dout, out, a);
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a, float* workspace, ThreadPool* pool) {
  forward_impl(out, lse, q, k, v, a, workspace, pool, Bf16GemmPath::convert);
}

void attention_forward(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionDims& a,
                       float* workspace, Bf16GemmPath path, ThreadPool* pool) {
  forward_impl(out, lse, q, k, v, a, workspace, pool, path);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, ThreadPool* pool, const float* row_dot) {
  backward_impl(dq, dk, dv, dout, q, k, v, out, lse, a, workspace, pool, row_dot, Bf16GemmPath::convert);
}

void attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, const AttentionDims& a, float* workspace,
                        Bf16GemmPath path, ThreadPool* pool, const float* row_dot) {
  backward_impl(dq, dk, dv, dout, q, k, v, out, lse, a, workspace, pool, row_dot, path);
}

}  // namespace peakbound::cpu
