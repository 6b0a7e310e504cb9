// The row movement of MoE expert dispatch on f32 rows of width H (CPU kernels):
// packing a rank's token-copies into send rows, grouping received rows by expert,
// putting results back in arrival order, and combining them at the source. Index
// arrays (copies, perm, order, starts) live in device memory beside the rows (on the
// CPU device, host memory); copy c is token c / K's k-th choice. Rows of the exchange:
// [x] forward, [x | dy | w] backward; results [out] or [dx | d w]. No row carries its
// expert: every rank derives each received row's expert from the shared plan.
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// dst[q] = src[rows[q]] for q < n, rows of `width` floats. WRITES dst.
void moe_gather_rows(float* dst, const float* src, const std::int64_t* rows, std::int64_t n, std::int64_t width);

// Send row q (of `width`: H, or 2H + 1 with dy) for copy c = copies[q]: x[c/K], and with
// dy: dy[c/K] and w[c]. WRITES dst [n, width].
void moe_pack_rows(float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const float* x, const float* dy, const float* w);

// Grouped row `at` is received row perm[at]: WRITES xg [n, H], and with dyg: dyg [n, H]
// and wg [n] (the gate weight column).
void moe_group_rows(float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);

// Back to arrival order: out[perm[at]] = outg[at] (H floats), and with dwg: out[perm[at]][H]
// = dwg[at]. WRITES those elements of out [n, width].
void moe_ungroup_rows(float* out, std::int64_t width, const float* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H);

// For each row q < m: dw[q] = dy[q] . o[q] (double accumulation), WRITTEN; then dy[q] *= w[q].
void moe_dot_scale_rows(float* dw, float* dy, const float* o, const float* w, std::int64_t m, std::int64_t H);

// Combine at the source, row q for copy c = copies[q], t = c / K, token by token: segment
// s is the rows order[starts[s] .. starts[s+1]) of one token, ascending, so each y[t] /
// dx[t] sums its rows in one fixed order (a GPU gathers per token, without atomics):
//   forward (y):   y[t] += w[c] * src[q][0:H]               ADDED
//   backward (dx): dx[t] += src[q][0:H] (ADDED); dw[c] = src[q][H] (WRITTEN)
// Exactly one of y, dx is non-null.
void moe_unpack_rows(const float* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, float* y,
                     const float* w, float* dx, float* dw);

}  // namespace peakbound::cpu
