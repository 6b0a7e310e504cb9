// The memory of the vocabulary loss as pure functions of its shapes and options: what
// each implementation allocates (BufferSpecs, all Component::vocab) and what is live
// together in each phase. The runtimes allocate every buffer from these specs, the
// planner composes the same footprints at model scale, and the tests check that the
// Arena's measured peaks equal them.
//
// Element sizes, two forms of each function:
//   Precision p   what the runtime allocates (VocabLossOptions::precision = p; the
//                 precision argument is what counts, o.precision is not read). Under
//                 bf16 the hidden states and carried W shards / token rows are bf16;
//                 every dW/dX accumulator (lanes, partials, the baseline's d_hidden_all)
//                 is fp32, and bf16 adds its narrowing buffers (g16, dx_tile,
//                 d_hidden32), which are 0 bytes under f32 (so f32 is byte-identical to
//                 elem_bytes = 4).
//   elem_bytes    the planner's estimate: every [*, H] tensor (hidden states, weight
//                 shards and their gradients) at elem_bytes, no narrowing buffers; 4 is
//                 exactly Precision::f32.
// Logits blocks and per-token statistics (max, sum, target logit, lse) are fp32 in both
// (the online log-sum-exp needs it), targets are int32.
//
// Phases (names as in the Footprint):
//   forward   everything live at the end of forward (the forward peak)
//   saved     what forward leaves allocated for backward
//   backward  saved + backward's scratch (the backward peak)
// and for a step through VocabLoss::forward_backward (ring_dtp_step_footprint):
//   forward_backward  the fused form's one phase (P = 1), or the three above (P > 1)
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

// What one rank's vocabulary loss runs on: every rank's token count (P = tokens.size(),
// uneven counts and zero are fine), the head's dimensions and this rank.
struct VocabLossShape {
  std::vector<std::int64_t> tokens;
  VocabDims dims;
  int rank = 0;

  // Every rank with the same token count (the planner's case).
  static VocabLossShape uniform(std::int64_t tokens_per_rank, const VocabDims& dims, int ranks, int rank = 0);
  int ranks() const { return static_cast<int>(tokens.size()); }
  std::int64_t own_tokens() const;
  std::int64_t max_tokens() const;
  std::int64_t total_tokens() const;
};

// ---- materialized (Megatron vocab-parallel cross-entropy) --------------------------
struct MaterializedVocabBuffers {
  // Allocated in forward and held until backward ends.
  BufferSpec hidden_all;    // [N, H] the group's hidden states (N = every rank's tokens)
  BufferSpec targets_all;   // [N] int32
  BufferSpec logits;        // [N, V/P] fp32; turned into its gradient in place
  BufferSpec lse;           // [N] fp32: row max, then log-sum-exp
  // Forward only.
  BufferSpec row_sum;       // [N] fp32
  BufferSpec target_logit;  // [N] fp32
  // Backward only.
  BufferSpec d_hidden_all;  // [N, H] partial dHidden of the whole group (fp32 under bf16)
  BufferSpec g16;           // bf16: [min(N, kLinearTileRows), V/P], a gradient row tile narrowed; f32: 0 bytes
  BufferSpec d_hidden32;    // bf16 with equal token counts: [T, H] fp32, the reduce-scatter's result; else 0
};
MaterializedVocabBuffers materialized_vocab_buffers(const VocabLossShape& s, const VocabLossOptions& o,
                                                    std::uint64_t elem_bytes);
MaterializedVocabBuffers materialized_vocab_buffers(const VocabLossShape& s, const VocabLossOptions& o, Precision p);
Footprint materialized_vocab_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes);
Footprint materialized_vocab_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p);

// ---- Ring-DTP -----------------------------------------------------------------------
// The mode a shape runs: o.mode, or for auto the smaller travelling set (token blocks
// when the largest rank's tokens are fewer than the largest shard's rows, else weights).
RingMode ring_dtp_mode(const VocabLossShape& s, const VocabLossOptions& o);

struct RingDtpBuffers {
  RingMode mode = RingMode::weights;  // resolved, never automatic
  BufferSpec lse;                     // [T] fp32, forward -> backward
  // keep_logits at P > 1: every logits block of the forward, forward -> backward (fp32):
  // [the group's tokens, rows] (activations) or [T, V] (weights); 0 bytes otherwise. With
  // it the blocks are made in place there and fwd_block and bwd_block are 0 bytes.
  BufferSpec kept;
  // Forward.
  BufferSpec fwd_block;  // [min(chunk, T), rows_max] (weights) or [min(chunk, Tmax), rows] (activations) fp32
  BufferSpec fwd_stats;  // running max/sum/target logit: [3T] (weights) or [3 Tmax] (activations) fp32
  // One hop's travelling set; the runtime holds each twice (double buffering). Empty
  // at P = 1. weights: {W shard [rows_max, H]}; activations: {hidden [Tmax, H],
  // targets [Tmax], stats [3 Tmax]}.
  std::vector<BufferSpec> fwd_lanes;
  // Backward.
  BufferSpec bwd_block;    // as fwd_block
  BufferSpec bwd_partial;  // this rank's dW [rows_max, H] / dX [Tmax, H] before it joins the travelling sum (P > 1)
  // weights: {W shard, dW accumulator [rows_max, H]}; activations: {hidden, targets,
  // lse [Tmax], dX accumulator [Tmax, H]}. Each held twice.
  std::vector<BufferSpec> bwd_lanes;
  // bf16 only (0 bytes under f32 and in the elem_bytes form), all backward scratch:
  BufferSpec g16;         // bwd_block's shape in bf16: the gradient block narrowed
  BufferSpec dx_tile;     // P = 1: [min(chunk, T), H] fp32, a chunk's dX before it is narrowed
  BufferSpec d_hidden32;  // weights mode, P > 1: [T, H] fp32, dX summed over the hops
  // The fused forward_backward (P = 1 only; empty otherwise): one [min(chunk, T), V]
  // fp32 block, turned into its gradient in place; nothing else, nothing saved. Under
  // bf16 also fused_g16 (that block narrowed) and dx_tile.
  BufferSpec fused_block;
  BufferSpec fused_g16;

  // Lane indices.
  static constexpr int kWeight = 0, kWeightGrad = 1;                         // weights mode
  static constexpr int kHidden = 0, kTargets = 1, kStats = 2, kLse = 2, kHiddenGrad = 3;  // activations mode
};
RingDtpBuffers ring_dtp_buffers(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes);
RingDtpBuffers ring_dtp_buffers(const VocabLossShape& s, const VocabLossOptions& o, Precision p);
// Ring-DTP in the mode ring_dtp_mode() picks for o.mode (force one by setting o.mode).
Footprint ring_dtp_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes);
Footprint ring_dtp_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p);
// Whether Ring-DTP's forward_backward takes the fused form for this shape (P = 1).
bool ring_dtp_fuses(const VocabLossShape& s);
// Ring-DTP through forward_backward: the fused form's phase "forward_backward" where it
// fuses, else ring_dtp_footprint (forward_backward is then forward + backward).
Footprint ring_dtp_step_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes);
Footprint ring_dtp_step_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p);

}  // namespace peakbound
