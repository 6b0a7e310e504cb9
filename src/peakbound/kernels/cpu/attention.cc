#include "peakbound/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/gemm.h"

namespace peakbound::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
inline float dot_f64(const float* a, const float* b, std::int64_t n) {
  double acc = 0.0;
  for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(acc);
}

// Key j is visible to query i: causal, and inside the sliding window when there is one.
inline bool visible(std::int64_t i, std::int64_t j, std::int64_t window) {
  return j <= i && (window == 0 || j > i - window);
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

}  // namespace

void attention_row_dot(float* row_dot, const float* dout, const float* out, const AttentionDims& a) {
  const std::int64_t rows = a.tokens * a.q_heads, Dv = a.v_dim;
  for (std::int64_t x = 0; x < rows; ++x) row_dot[x] = dot_f64(dout + x * Dv, out + x * Dv, Dv);
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a, float* workspace, ThreadPool* pool) {
  check_attention_dims(a);
  const std::int64_t T = a.tokens, Tk = a.key_tokens(), Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  // Global positions: query row i is qo + i, key row j is ko + j.
  const std::int64_t qo = a.q_offset, ko = a.k_offset;
  const float scale = a.effective_scale();
  const std::int64_t q_blocks = (T + Bq - 1) / Bq, items = Hq * q_blocks;
  const std::int64_t slot_floats = Bq * Bk + 2 * Bq;

  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* S = workspace + slot * slot_floats;  // [Bq, Bk] scores, then probabilities
    float* m = S + Bq * Bk;                     // [Bq] running max
    float* l = m + Bq;                          // [Bq] running sum of exp(s - m)
    for (std::int64_t item = slot; item < items; item += a.threads) {
      const std::int64_t h = item / q_blocks, g = h / group;
      const std::int64_t i0 = (item % q_blocks) * Bq, i1 = std::min(i0 + Bq, T), rows = i1 - i0;
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
      const std::int64_t k_hi = std::min(Tk, i1 + qo - ko);
      const std::int64_t k_lo = W > 0 ? std::max<std::int64_t>(0, i0 + qo - ko - W + 1) : 0;
      for (std::int64_t j0 = k_lo / Bk * Bk; k_lo < k_hi && j0 < k_hi; j0 += Bk) {
        const std::int64_t cols = std::min(j0 + Bk, k_hi) - j0;
        // S = scale * Q_tile K_tile^T (GEMM over strided rows: no copies).
        gemm_f32(false, true, rows, cols, D, scale, q + (i0 * Hq + h) * D, Hq * D, k + (j0 * Hkv + g) * D, Hkv * D,
                 0.0f, S, Bk);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = qo + i0 + r;
          float* s = S + r * Bk;
          float row_max = kNegInf;
          for (std::int64_t c = 0; c < cols; ++c) {
            if (!visible(i, ko + j0 + c, W)) s[c] = kNegInf;
            row_max = std::max(row_max, s[c]);
          }
          if (row_max == kNegInf) {  // nothing of this row in this key tile: adds zeros
            std::fill_n(s, cols, 0.0f);
            continue;
          }
          const float m_new = std::max(m[r], row_max);
          const float alpha = std::exp(m[r] - m_new);  // 0 on the row's first tile
          if (alpha != 1.0f) {
            float* oi = o_tile + r * Hq * Dv;
            for (std::int64_t d = 0; d < Dv; ++d) oi[d] *= alpha;
          }
          float sum = 0.0f;
          for (std::int64_t c = 0; c < cols; ++c) {
            s[c] = s[c] == kNegInf ? 0.0f : std::exp(s[c] - m_new);
            sum += s[c];
          }
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
        }
        // O_tile += P V_tile
        gemm_f32(false, false, rows, Dv, cols, 1.0f, S, Bk, v + (j0 * Hkv + g) * Dv, Hkv * Dv, 1.0f, o_tile, Hq * Dv);
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

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, ThreadPool* pool, const float* row_dot) {
  check_attention_dims(a);
  const std::int64_t T = a.tokens, Tk = a.key_tokens(), Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  const std::int64_t qo = a.q_offset, ko = a.k_offset;
  const float scale = a.effective_scale();
  // D_i = rowsum(dout * out) [T, Hq]: the caller's, or computed into the workspace.
  float* own_di = row_dot != nullptr ? nullptr : workspace;
  const float* Di = row_dot != nullptr ? row_dot : own_di;
  float* tiles = row_dot != nullptr ? workspace : workspace + T * Hq;

  // One share per kv head (strided): it owns dk and dv of that head and dq of its query
  // heads, so no two shares write the same element and no reduction is needed.
  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* P = tiles + slot * 2 * Bq * Bk;  // [Bq, Bk] probabilities
    float* dS = P + Bq * Bk;                // [Bq, Bk] dP, then scale * dL/dscore
    for (std::int64_t g = slot; g < Hkv; g += a.threads) {
      const std::int64_t h_lo = g * group, h_hi = h_lo + group;
      for (std::int64_t i = 0; i < T; ++i)
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
        const float* k_tile = k + (j0 * Hkv + g) * D;
        const float* v_tile = v + (j0 * Hkv + g) * Dv;
        float* dk_tile = dk + (j0 * Hkv + g) * D;
        float* dv_tile = dv + (j0 * Hkv + g) * Dv;
        // Query rows that see some key of this tile: from the tile's first key's
        // position to its last key's position + W (exclusive), clipped to [0, T).
        const std::int64_t q_lo = std::max<std::int64_t>(0, j0 + ko - qo);
        const std::int64_t q_hi = W > 0 ? std::min(T, j0 + cols - 1 + W + ko - qo) : T;
        for (std::int64_t h = h_lo; h < h_hi; ++h) {
          for (std::int64_t i0 = q_lo / Bq * Bq; q_lo < q_hi && i0 < q_hi; i0 += Bq) {
            const std::int64_t rows = std::min(i0 + Bq, q_hi) - i0;
            const float* q_tile = q + (i0 * Hq + h) * D;
            const float* do_tile = dout + (i0 * Hq + h) * Dv;
            // P = exp(scale Q K^T - lse) (0 where masked), dP = dO V^T.
            gemm_f32(false, true, rows, cols, D, scale, q_tile, Hq * D, k_tile, Hkv * D, 0.0f, P, Bk);
            gemm_f32(false, true, rows, cols, Dv, 1.0f, do_tile, Hq * Dv, v_tile, Hkv * Dv, 0.0f, dS, Bk);
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              const float lse_i = lse[i * Hq + h], d_i = Di[i * Hq + h];
              float* p = P + r * Bk;
              float* ds = dS + r * Bk;
              for (std::int64_t c = 0; c < cols; ++c) {
                p[c] = visible(qo + i, ko + j0 + c, W) ? std::exp(p[c] - lse_i) : 0.0f;
                ds[c] = p[c] * (ds[c] - d_i) * scale;
              }
            }
            // dV_tile += P^T dO, dK_tile += dS^T Q, dQ_tile += dS K.
            gemm_f32(true, false, cols, Dv, rows, 1.0f, P, Bk, do_tile, Hq * Dv, 1.0f, dv_tile, Hkv * Dv);
            gemm_f32(true, false, cols, D, rows, 1.0f, dS, Bk, q_tile, Hq * D, 1.0f, dk_tile, Hkv * D);
            gemm_f32(false, false, rows, D, cols, 1.0f, dS, Bk, k_tile, Hkv * D, 1.0f, dq + (i0 * Hq + h) * D, Hq * D);
          }
        }
      }
    }
  });
}

}  // namespace peakbound::cpu
