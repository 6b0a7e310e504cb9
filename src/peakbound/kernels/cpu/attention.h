// Causal self-attention with grouped-query heads, flash style, llm.c style free
// functions over raw row-major f32 pointers. One sequence of T tokens per call (a
// batch is one call per sequence). No [T, T] matrix: the forward runs an online softmax
// over key blocks and keeps only the log-sum-exp per (token, head); the backward
// (FlashAttention-2) recomputes each score block from q, k and lse.
//
// Shapes (row-major):
//   q [T, Hq, D]   k [T, Hkv, D]   v [T, Hkv, Dv]   out, dout [T, Hq, Dv]   lse [T, Hq]
// Hq is a multiple of Hkv; query head h reads kv head h / (Hq / Hkv). lse is [T, Hq]
// (token-major, like every activation here and like layers/attention_footprint.h), in
// natural log of the scaled scores: lse[i, h] = log sum_j exp(scale * q_i . k_j).
// Causal: token i attends to keys j <= i; with window W > 0 only to i - W < j <= i
// (transformers' sliding_window: W keys including itself).
//
// Blocks of a longer sequence (ring attention, schedules/ring_attention.h): the queries
// may be Tq = tokens rows starting at global position q_offset and the keys Tk =
// kv_tokens rows starting at k_offset; query row i sees key row j iff
// k_offset + j <= q_offset + i (and q_offset + i - k_offset - j < W with a window).
// Tiles whose keys all lie after the tile's queries (or all before its window) are
// skipped, not masked. A query row with no visible key gets out 0 and lse -inf.
// With accumulate the calls fold blocks together: the forward reads out and lse as a
// running state (a row's normalised output so far and its log-sum-exp; lse -inf: no key
// yet, out not read) and writes back the merged state; the backward ADDS INTO dq, dk,
// dv, so a block's gradients sum over the calls that share it.
//
// The tile products (S = Q K^T, O += P V; backward also dP = dO V^T, dV += P^T dO,
// dK += dS^T Q, dQ += dS K) are cpu::gemm_f32 calls on strided row blocks (no copies):
// 2.5x (forward) and 4x (backward) the vectorisable loops they replaced (T=2048).
// D_i = rowsum(dout * out) is accumulated in double, since dP_ij - D_i cancels.
//
// Determinism: every output element is produced by one task in a fixed order that
// does not depend on the thread count or on which thread runs the task, so the bits
// are the same every run and for every pool (OpenBLAS splits a GEMM over rows and
// columns, never over the reduction, so its own thread count does not change the bits
// either). Changing block_q / block_k reorders the fp32 sums only.
#pragma once

#include <cstdint>

#include "peakbound/kernels/attention_dims.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::cpu {

// AttentionDims, check_attention_dims and the workspace sizes are backend-neutral
// (kernels/attention_dims.h); named here too so the kernel reads as before.
using ::peakbound::AttentionDims;
using ::peakbound::attention_backward_workspace_floats;
using ::peakbound::attention_forward_workspace_floats;
using ::peakbound::attention_workspace_floats;
using ::peakbound::check_attention_dims;

// row_dot [T, Hq] WRITTEN: D_i = rowsum(dout * out) per (token, head), accumulated in
// double and rounded once (what attention_backward computes itself when not given it;
// a caller folding several key blocks into the same queries computes it once).
void attention_row_dot(float* row_dot, const float* dout, const float* out, const AttentionDims& a);

// Shapes with blocks: q, out, dout, dq, lse have Tq = tokens rows, k, v, dk, dv have
// Tk = key_tokens() rows (row strides are Hq * D, Hkv * D, ... as above, so a block is
// a pointer into a longer tensor).
// q, k, v -> out [T, Hq, Dv], lse [T, Hq], both WRITTEN (accumulate: read and written
// back merged). workspace: at least
// attention_forward_workspace_floats(a) floats. pool: runs the a.threads shares on it
// (its size should be a.threads); null runs them one after another on the caller.
// Outputs must not alias inputs.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionDims& a, float* workspace, ThreadPool* pool = nullptr);

// dout, q, k, v, out, lse (from the forward) -> dq [T, Hq, D], dk [T, Hkv, D],
// dv [T, Hkv, Dv], all WRITTEN, not added: they are fresh gradients with one consumer
// each (the Q/K/V projections' backward GEMMs, which add into the input gradient
// themselves), and the kernel would otherwise need the caller to zero-fill them.
// With accumulate they are ADDED INTO instead (out and lse are then the whole row's
// final values, not this block's). row_dot: null computes D_i into the workspace; else
// [T, Hq] READ (attention_row_dot's result) and the workspace needs only
// attention_backward_workspace_floats(a, true) floats.
// workspace: at least attention_backward_workspace_floats(a) floats. Work is split by
// kv head (a kv head owns its dk, dv and its query heads' dq), so more than Hkv
// threads add nothing. Outputs must not alias inputs.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionDims& a, float* workspace, ThreadPool* pool = nullptr,
                        const float* row_dot = nullptr);

}  // namespace peakbound::cpu
