// The dimensions of one causal GQA attention call and what follows from them alone:
// their check and the workspace each pass needs. Backend-neutral plain data: the
// kernels of every backend (kernels/cpu/attention.h has the shapes and the math,
// kernels/cuda/attention.h), the op (ops/attention.h) and the footprints above it
// (layers/attention_layer, schedules/ring_attention) share it, so it sits at the
// kernels' level without belonging to one backend.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound {

// One call's dimensions and tiling.
struct AttentionDims {
  std::int64_t tokens = 0;    // T (Tq): query rows
  std::int64_t q_heads = 0;   // Hq
  std::int64_t kv_heads = 0;  // Hkv, divides Hq
  std::int64_t qk_dim = 0;    // D
  std::int64_t v_dim = 0;     // Dv
  float scale = 0.0f;         // score scale; 0 means 1 / sqrt(D)
  std::int64_t window = 0;    // sliding window in keys; 0: none (full causal)
  // Bq x Bk: query rows and keys per tile. 128 x 128 on the CPU: `bench attention`
  // (4096 tokens, 8 heads, 1 thread, f32) ran 1.4-1.5x the forward and 1.3-1.5x the
  // backward GFLOP/s of 64 x 64 at head dims 32 and 128 (the tile GEMMs' fixed costs
  // amortised); larger tiles gained no more at dim 128. Workspace: a slot's fp32 tile is
  // 64 KiB (kernels/cpu/attention.h).
  std::int64_t block_q = 128;
  std::int64_t block_k = 128;
  // Workspace slots: the most tasks that run at once (a pool's size). The workspace
  // holds one slot each, and the work is split into this many fixed strided shares.
  int threads = 1;
  // Blocks of a longer sequence (defaults: one whole sequence, outputs written).
  std::int64_t kv_tokens = 0;  // Tk: key rows; 0 means tokens
  std::int64_t q_offset = 0;   // global position of query row 0
  std::int64_t k_offset = 0;   // global position of key row 0
  bool accumulate = false;     // forward: out/lse are a running state; backward: dq, dk, dv ADDED INTO

  float effective_scale() const;
  std::int64_t key_tokens() const { return kv_tokens > 0 ? kv_tokens : tokens; }
};

// Throws InvalidArgument naming the first bad field (T, heads, dims, blocks >= 1;
// Hq % Hkv == 0; window >= 0; threads >= 1; kv_tokens, q_offset, k_offset >= 0).
void check_attention_dims(const AttentionDims& a);

// Workspace floats each pass needs: pure functions of the dims and the dtype of q, k, v
// (f32 or bf16; anything else is InvalidArgument), so a caller allocates them from a
// footprint. Forward: threads * (Bq * Bk + 2 Bq) (one fp32 score tile and the running
// max and sum per row), and under bf16 each slot also holds the probabilities rounded to
// bf16 for O += P V: ceil(Bq * Bk / 2) floats more. Backward: T * Hq (D_i = rowsum(dout
// * out); not when the caller passes it, row_dot_given) + threads * 2 * Bq * Bk (the fp32
// P and dS tiles), and under bf16 their bf16 copies for the gradient GEMMs: Bq * Bk
// floats more a slot. attention_workspace_floats is the max of the two: one buffer
// serving both passes. The workspace is float-aligned; bf16 tiles sit at float offsets.
std::int64_t attention_forward_workspace_floats(const AttentionDims& a, DType dtype = DType::f32);
std::int64_t attention_backward_workspace_floats(const AttentionDims& a, bool row_dot_given = false,
                                                 DType dtype = DType::f32);
std::int64_t attention_workspace_floats(const AttentionDims& a, DType dtype = DType::f32);

// The tiles the tiled kernels compute, and so the work a window saves: blocks wholly
// outside the causal window are skipped, never computed and masked. Rows [lo, hi) of a
// pass's inner loop (empty when lo >= hi); the CPU kernels iterate exactly these.
struct TileRange {
  std::int64_t lo = 0, hi = 0;
};
// Forward: the keys query rows [i0, i1) see: from the first key visible to row i0 (0
// without a window) to the last visible to row i1 - 1, clipped to [0, Tk); the loop walks
// them on the Bk grid from key row 0.
inline TileRange attention_forward_keys(const AttentionDims& a, std::int64_t i0, std::int64_t i1) {
  const std::int64_t d = a.q_offset - a.k_offset;
  const std::int64_t hi = i1 + d < a.key_tokens() ? i1 + d : a.key_tokens();
  const std::int64_t lo = a.window > 0 && i0 + d - a.window + 1 > 0 ? i0 + d - a.window + 1 : 0;
  return {lo, hi};
}
// Backward: the query rows that see some key of keys [j0, j0 + cols): from the first key's
// position to the last key's position + W (exclusive), clipped to [0, Tq); the loop walks
// them on the Bq grid from query row 0.
inline TileRange attention_backward_queries(const AttentionDims& a, std::int64_t j0, std::int64_t cols) {
  const std::int64_t d = a.k_offset - a.q_offset;
  const std::int64_t lo = j0 + d > 0 ? j0 + d : 0;
  const std::int64_t last = j0 + cols - 1 + a.window + d;
  const std::int64_t hi = a.window > 0 && last < a.tokens ? last : a.tokens;
  return {lo, hi};
}
// [Bq x Bk] score tiles one call computes for one query head: forward (query tile, key
// tile) pairs and backward (key tile, query tile) pairs, counted over the loops above.
struct AttentionTiles {
  std::int64_t forward = 0, backward = 0;
};
AttentionTiles attention_tiles(const AttentionDims& a);

}  // namespace peakbound
