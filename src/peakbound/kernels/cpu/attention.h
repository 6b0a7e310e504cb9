// Causal self-attention with grouped-query heads, flash style, llm.c style free
// functions over raw row-major f32 (or bf16, below) pointers. One sequence of T tokens
// per call (a batch is one call per sequence). No [T, T] matrix: the forward runs an
// online softmax over key blocks and keeps only the log-sum-exp per (token, head); the
// backward (FlashAttention-2) recomputes each score block from q, k and lse.
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
// 2.5x (forward) and 4x (backward) the vectorisable loops they replaced (T=2048); but the
// score products read K and V transposed into a per-thread tile of the key block, as NN
// products (OpenBLAS packs an NT one: attention.cc, Wide), where D and the tiles are at
// most 512.
// D_i = rowsum(dout * out) is accumulated in double, since dP_ij - D_i cancels.
//
// Mixed precision (bf16 overloads below, docs/design.md "Mixed precision"): q, k, v,
// dout and the saved out may be bf16, as FlashAttention-2 runs: the tile products go
// through cpu::gemm_bf16 on the caller's path (fp32 accumulation): S = Q K^T and
// dP = dO V^T on bf16 operands; P is rounded to bf16 for O += P V and dV += P^T dO, dS
// to bf16 for dK += dS^T Q and dQ += dS K (each rounded once, at most 2^-8 relative per
// element). The softmax statistics (running max m, sum l taken from the unrounded P),
// lse, D_i and dS itself are computed in fp32 (D_i in double) exactly as in the f32 form.
// What stays fp32 under bf16 and why:
//   out     fp32 in both forms. With accumulate it is a running state merged at every
//           ring step (rescaled by exp(m_old - m_new) and re-normalised); a bf16 state
//           would round at each step, adding up to one bf16 rounding per key block. An
//           fp32 out rounds nowhere; the caller narrows it once after the last block
//           (one pass over [T, Hq, Dv], nothing against the O(T^2) attention) to the
//           bf16 activation it saves and passes back as the backward's `out`.
//   lse     fp32 (a statistic).
//   dq, dk, dv  fp32 accumulators: the backward adds into them across key blocks (ring
//           attention) and within a call across tiles; the caller narrows once after the
//           last block.
// Workspace under bf16: the bf16 P / dS tiles need room beside the fp32 ones; size it
// with the dtype, attention_{forward,backward}_workspace_floats(a, ..., DType::bf16).
// On the convert path (gemm_bf16.h) each tile operand is widened once (Q and dO once a
// tile, K and V once a key block; K and V also transposed, so that the score products run
// as NN sgemm calls, which OpenBLAS takes through its small-matrix kernel where an NT one
// packs), and P and dS are rounded into fp32 as they are made (no widening pass); the
// products sum as gemm_bf16's would, so the bits are that path's (tests: ConvertWidens-
// EachOperandOnceWithTheSameBits) on whole tiles; on some tiles cut short OpenBLAS rounds
// the NT and NN products differently (attention.cc, Wide). A tile product at a time
// widened both operands, 10 widenings a backward block. docs/training.md gives timings.
// The bf16 forms are not bitwise the f32 kernel on widened inputs (P and dS are rounded
// and the GEMM's sum order differs): tests/kernels/attention_bf16_test.cc bounds them.
// Speed (T=2048, Hq=8, Hkv=2, D=64, Bq=Bk=64, forward+backward, 2 AMD EPYC cores with
// AVX512-BF16, alternating runs): bf16 about 1.0x f32 on the native path with one BLAS
// thread, but 0.64x with two: gemm_bf16 splits a 64x64x64 tile product (2^18 MACs, its
// parallel threshold) over its pool, where sgemm shows no such cost at that size. The tile
// products are small and the exp / softmax loops take a third of the time, so bf16's
// GEMM rate barely shows; Bq=Bk=128 with 2 pool threads: 1.18x.
//
// Determinism: every output element is produced by one task in a fixed order that
// does not depend on the thread count or on which thread runs the task, so the bits
// are the same every run and for every pool (OpenBLAS splits a GEMM over rows and
// columns, never over the reduction, so its own thread count does not change the bits
// either; gemm_bf16 likewise). Changing block_q / block_k reorders the fp32 sums only.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/attention_dims.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"

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
// bf16 dout and out (the saved, narrowed out): widened, the same double sum.
void attention_row_dot(float* row_dot, const bf16* dout, const bf16* out, const AttentionDims& a);

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
// bf16 q, k, v; out and lse fp32 as above (accumulate: the same fp32 running state).
// Tile products on `path` (ops take it from ops::bf16_gemm_path()). workspace: at least
// attention_forward_workspace_floats(a, DType::bf16) floats.
void attention_forward(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionDims& a,
                       float* workspace, Bf16GemmPath path, ThreadPool* pool = nullptr);

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
// bf16 dout, q, k, v and out (the forward's out narrowed once); lse, row_dot fp32;
// dq, dk, dv fp32, WRITTEN or (accumulate) ADDED INTO as above. workspace: at least
// attention_backward_workspace_floats(a, row_dot != nullptr, DType::bf16) floats.
void attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, const AttentionDims& a, float* workspace,
                        Bf16GemmPath path, ThreadPool* pool = nullptr, const float* row_dot = nullptr);

}  // namespace peakbound::cpu
