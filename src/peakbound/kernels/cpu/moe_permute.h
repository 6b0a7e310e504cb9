// The row movement of MoE expert dispatch (CPU kernels): packing a rank's token-copies
// into send rows, grouping received rows by expert, putting results back in arrival
// order, and combining them at the source. Index arrays (copies, perm, order, starts)
// live in device memory beside the rows (on the CPU device, host memory); copy c is
// token c / K's k-th choice. No row carries its expert: every rank derives each received
// row's expert from the shared plan.
//
// Rows hold elements of one storage type T, f32 or bf16; the routing weight w (and its
// gradient dw) is always fp32 and travels exactly, in S "weight slots" at the row's end:
//   f32  (S = 1): the weight is one float.
//   bf16 (S = 2): the weight's fp32 bits split over two bf16 elements, slot 0 its high
//                 half (so it also reads as w truncated to bf16), slot 1 its low half.
// Rows of the exchange, in elements of T (ops/moe_permute.h: moe_send_width,
// moe_result_width):
//   send:   forward [x] (H);             backward [x | dy | w] (2H + S)
//   result: forward [out] (H);           backward [dx | dw] (H + S)
// Under bf16 every H-wide row (x, dy, out, dx, grouped xg/dyg/outg, the combined y and
// dx) is bf16; w, wg, dwg and dw stay fp32. Each kernel is written once over T: it
// widens what it loads (exact), computes in fp32 (the dot in double) exactly as the f32
// form, and rounds once where it stores a bf16, so a bf16 kernel's bf16 outputs are
// bitwise to_bf16(the f32 kernel's outputs on the widened inputs) and its fp32 outputs
// the f32 kernel's bits. Row copies (gather, pack, group, ungroup) only move elements.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

// dst[q] = src[rows[q]] for q < n, rows of `width` elements. WRITES dst.
void moe_gather_rows(float* dst, const float* src, const std::int64_t* rows, std::int64_t n, std::int64_t width);
void moe_gather_rows(bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n, std::int64_t width);

// Send row q (of `width`: H, or 2H + S with dy) for copy c = copies[q]: x[c/K], and with
// dy: dy[c/K] and w[c] in the weight slots. WRITES dst [n, width] (elements past the
// weight slots, if width is larger, are not written).
void moe_pack_rows(float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const float* x, const float* dy, const float* w);
void moe_pack_rows(bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const bf16* x, const bf16* dy, const float* w);

// Grouped row `at` is received row perm[at]: WRITES xg [n, H], and with dyg: dyg [n, H]
// and wg [n] (fp32, the gate weight from the row's weight slots).
void moe_group_rows(float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_group_rows(bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width, const std::int64_t* perm,
                    std::int64_t n, std::int64_t H);

// Back to arrival order: out[perm[at]][0:H] = outg[at], and with dwg: out[perm[at]]'s
// weight slots (from element H) = dwg[at] (fp32). WRITES those elements of out [n, width].
void moe_ungroup_rows(float* out, std::int64_t width, const float* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H);
void moe_ungroup_rows(bf16* out, std::int64_t width, const bf16* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H);

// For each row q < m: dw[q] = dy[q] . o[q] (double accumulation, in k order; fp32
// WRITTEN); then dy[q] *= w[q] (fp32 product, rounded once to T: IN PLACE). dy and o are
// T, w and dw fp32.
void moe_dot_scale_rows(float* dw, float* dy, const float* o, const float* w, std::int64_t m, std::int64_t H);
void moe_dot_scale_rows(float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m, std::int64_t H);

// Combine at the source, row q for copy c = copies[q], t = c / K, token by token: segment
// s is the rows order[starts[s] .. starts[s+1]) of one token, ascending, so each y[t] /
// dx[t] sums its rows in one fixed order (a GPU gathers per token, without atomics):
//   forward (y):   y[t] += w[c] * src[q][0:H]               ADDED
//   backward (dx): dx[t] += src[q][0:H] (ADDED); dw[c] = src[q]'s weight slots (WRITTEN)
// A token's sum runs in fp32 from y[t] (dx[t]) through its segment's rows and is rounded
// once to T at the end (a bf16 y or dx is rounded once per call, not once per row).
// src, y and dx are T; w and dw fp32. Exactly one of y, dx is non-null.
void moe_unpack_rows(const float* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, float* y,
                     const float* w, float* dx, float* dw);
void moe_unpack_rows(const bf16* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, bf16* y,
                     const float* w, bf16* dx, float* dw);

}  // namespace peakbound::cpu
