#include "peakbound/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"

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

// y += a * x
inline void axpy(float* y, const float* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
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

void bad(const std::string& what) { throw InvalidArgument("attention: " + what); }

}  // namespace

float AttentionDims::effective_scale() const {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(qk_dim)));
}

void check_attention_dims(const AttentionDims& a) {
  if (a.tokens < 1) bad("tokens must be >= 1, got " + std::to_string(a.tokens));
  if (a.q_heads < 1 || a.kv_heads < 1)
    bad("q_heads and kv_heads must be >= 1, got " + std::to_string(a.q_heads) + ", " + std::to_string(a.kv_heads));
  if (a.q_heads % a.kv_heads != 0)
    bad("q_heads " + std::to_string(a.q_heads) + " is not a multiple of kv_heads " + std::to_string(a.kv_heads));
  if (a.qk_dim < 1 || a.v_dim < 1)
    bad("qk_dim and v_dim must be >= 1, got " + std::to_string(a.qk_dim) + ", " + std::to_string(a.v_dim));
  if (a.block_q < 1 || a.block_k < 1)
    bad("block_q and block_k must be >= 1, got " + std::to_string(a.block_q) + ", " + std::to_string(a.block_k));
  if (a.window < 0) bad("window must be >= 0 (0: none), got " + std::to_string(a.window));
  if (a.threads < 1) bad("threads must be >= 1, got " + std::to_string(a.threads));
  if (!std::isfinite(a.scale)) bad("scale must be finite");
}

std::int64_t attention_forward_workspace_floats(const AttentionDims& a) {
  return static_cast<std::int64_t>(a.threads) * (a.block_q * a.block_k + 2 * a.block_q);
}

std::int64_t attention_backward_workspace_floats(const AttentionDims& a) {
  return a.tokens * a.q_heads + static_cast<std::int64_t>(a.threads) * 2 * a.block_q * a.block_k;
}

std::int64_t attention_workspace_floats(const AttentionDims& a) {
  return std::max(attention_forward_workspace_floats(a), attention_backward_workspace_floats(a));
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a, float* workspace, ThreadPool* pool) {
  check_attention_dims(a);
  const std::int64_t T = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  const float scale = a.effective_scale();
  const std::int64_t q_blocks = (T + Bq - 1) / Bq, items = Hq * q_blocks;
  const std::int64_t slot_floats = Bq * Bk + 2 * Bq;

  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* S = workspace + slot * slot_floats;  // [Bq, Bk] scores, then probabilities
    float* m = S + Bq * Bk;                     // [Bq] running max
    float* l = m + Bq;                          // [Bq] running sum of exp(s - m)
    for (std::int64_t item = slot; item < items; item += a.threads) {
      const std::int64_t h = item / q_blocks, g = h / group;
      const std::int64_t i0 = (item % q_blocks) * Bq, i1 = std::min(i0 + Bq, T);
      for (std::int64_t r = 0; r < i1 - i0; ++r) {
        m[r] = kNegInf;
        l[r] = 0.0f;
        std::fill_n(out + ((i0 + r) * Hq + h) * Dv, Dv, 0.0f);
      }
      // Keys the tile sees: [first visible to row i0, i1), on the Bk grid.
      const std::int64_t k_lo = W > 0 ? std::max<std::int64_t>(0, i0 - W + 1) : 0;
      for (std::int64_t j0 = k_lo / Bk * Bk; j0 < i1; j0 += Bk) {
        const std::int64_t j1 = std::min(j0 + Bk, i1);
        for (std::int64_t r = 0; r < i1 - i0; ++r) {
          const std::int64_t i = i0 + r;
          const float* qi = q + (i * Hq + h) * D;
          float* s = S + r * Bk;
          float row_max = kNegInf;
          for (std::int64_t j = j0; j < j1; ++j) {
            float x = kNegInf;
            if (visible(i, j, W)) x = scale * dot(qi, k + (j * Hkv + g) * D, D);
            s[j - j0] = x;
            row_max = std::max(row_max, x);
          }
          if (row_max == kNegInf) continue;  // nothing of this row in this key tile
          const float m_new = std::max(m[r], row_max);
          const float alpha = std::exp(m[r] - m_new);  // 0 on the row's first tile
          float* oi = out + (i * Hq + h) * Dv;
          if (alpha != 1.0f)
            for (std::int64_t d = 0; d < Dv; ++d) oi[d] *= alpha;
          float sum = 0.0f;
          for (std::int64_t j = j0; j < j1; ++j) {
            if (s[j - j0] == kNegInf) continue;
            const float p = std::exp(s[j - j0] - m_new);
            sum += p;
            axpy(oi, v + (j * Hkv + g) * Dv, Dv, p);
          }
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
        }
      }
      // Every row saw at least its own key, so l > 0 and m is finite.
      for (std::int64_t r = 0; r < i1 - i0; ++r) {
        const std::int64_t i = i0 + r;
        float* oi = out + (i * Hq + h) * Dv;
        for (std::int64_t d = 0; d < Dv; ++d) oi[d] /= l[r];
        lse[i * Hq + h] = m[r] + std::log(l[r]);
      }
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, ThreadPool* pool) {
  check_attention_dims(a);
  const std::int64_t T = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const std::int64_t Bq = a.block_q, Bk = a.block_k, W = a.window, group = Hq / Hkv;
  const float scale = a.effective_scale();
  float* Di = workspace;  // [T, Hq] rowsum(dout * out)
  float* tiles = workspace + T * Hq;

  // One share per kv head (strided): it owns dk and dv of that head and dq of its query
  // heads, so no two shares write the same element and no reduction is needed.
  run_shares(a.threads, pool, [&](std::int64_t slot) {
    float* P = tiles + slot * 2 * Bq * Bk;  // [Bq, Bk] probabilities
    float* dS = P + Bq * Bk;                // [Bq, Bk] scale * dL/dscore
    for (std::int64_t g = slot; g < Hkv; g += a.threads) {
      const std::int64_t h_lo = g * group, h_hi = h_lo + group;
      for (std::int64_t i = 0; i < T; ++i) {
        for (std::int64_t h = h_lo; h < h_hi; ++h) {
          Di[i * Hq + h] = dot(dout + (i * Hq + h) * Dv, out + (i * Hq + h) * Dv, Dv);
          std::fill_n(dq + (i * Hq + h) * D, D, 0.0f);
        }
        std::fill_n(dk + (i * Hkv + g) * D, D, 0.0f);
        std::fill_n(dv + (i * Hkv + g) * Dv, Dv, 0.0f);
      }
      for (std::int64_t j0 = 0; j0 < T; j0 += Bk) {
        const std::int64_t j1 = std::min(j0 + Bk, T);
        // Queries that see some key of this tile: [j0, j1 - 1 + W) clipped to T.
        const std::int64_t q_hi = W > 0 ? std::min(T, j1 - 1 + W) : T;
        for (std::int64_t h = h_lo; h < h_hi; ++h) {
          for (std::int64_t i0 = j0 / Bq * Bq; i0 < q_hi; i0 += Bq) {
            const std::int64_t i1 = std::min(i0 + Bq, q_hi);
            // P = exp(scale q k - lse), dS = P * (dout . v - D_i) * scale.
            for (std::int64_t i = i0; i < i1; ++i) {
              const float* qi = q + (i * Hq + h) * D;
              const float* doi = dout + (i * Hq + h) * Dv;
              const float lse_i = lse[i * Hq + h], d_i = Di[i * Hq + h];
              float* p = P + (i - i0) * Bk;
              float* ds = dS + (i - i0) * Bk;
              for (std::int64_t j = j0; j < j1; ++j) {
                if (!visible(i, j, W)) {
                  p[j - j0] = 0.0f;
                  ds[j - j0] = 0.0f;
                  continue;
                }
                const float pij = std::exp(scale * dot(qi, k + (j * Hkv + g) * D, D) - lse_i);
                const float dpij = dot(doi, v + (j * Hkv + g) * Dv, Dv);
                p[j - j0] = pij;
                ds[j - j0] = pij * (dpij - d_i) * scale;
              }
            }
            // dv_j += P^T dout, dk_j += dS^T q (rows in order, per key).
            for (std::int64_t j = j0; j < j1; ++j) {
              float* dvj = dv + (j * Hkv + g) * Dv;
              float* dkj = dk + (j * Hkv + g) * D;
              for (std::int64_t i = i0; i < i1; ++i) {
                const float pij = P[(i - i0) * Bk + (j - j0)];
                if (pij == 0.0f) continue;
                axpy(dvj, dout + (i * Hq + h) * Dv, Dv, pij);
                axpy(dkj, q + (i * Hq + h) * D, D, dS[(i - i0) * Bk + (j - j0)]);
              }
            }
            // dq_i += dS k (keys in order, per query).
            for (std::int64_t i = i0; i < i1; ++i) {
              float* dqi = dq + (i * Hq + h) * D;
              for (std::int64_t j = j0; j < j1; ++j) {
                const float dsij = dS[(i - i0) * Bk + (j - j0)];
                if (dsij == 0.0f) continue;
                axpy(dqi, k + (j * Hkv + g) * D, D, dsij);
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace peakbound::cpu
