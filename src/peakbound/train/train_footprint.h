// The device (and host) memory of one `peakbound train` step on one rank, as a pure
// function of the model, the layout, the micro-batch and the schedules: what
// MoeTransformer and Trainer allocate, composed from the very BufferSpec functions
// their runtimes allocate from (parameter_store_buffers with model_store_specs'
// selectors, fsdp_buffers with the stores' slices as its tail, model_aux_buffers, model_batch_buffers,
// attention_layer_footprint, moe_layer_footprint,
// dispatch_footprint, materialized_vocab_footprint / ring_dtp_footprint,
// checkpoint_buffers, optimizer_footprint). Measured Arena peaks after a step equal it
// per component (tests/train/train_footprint_*test.cc).
//
// Persistent (every phase after the trainer exists): the three stores' params and
// grads, the FSDP shard buffers (which hold the trainer's slices too), the optimizer's device state, the
// model's aux-loss buffers, the stack's ring slots (device) and offloaded boundaries
// (host), the optimizer's host state and staging. Each phase adds what is live at
// one moment of the step (T = sequences x seq_len tokens on this rank):
//   optimizer load             the trainer's constructor: stores, shards, aux, the
//                              optimizer's load phase (no stack yet)
//   embedding forward          ids, targets, the gathered embedding (written into the
//                              stack's first boundary: no x in the forward)
//   forward attention project / forward attention   ids, targets, y; the resident
//                              boundaries acquired by the last layer's forward; the
//                              attention sublayer's projections / its kernel (writing
//                              into the layer's output: no mid)
//   forward mlp / forward dense mlp   the last MoE / dense layer: the MLP sublayer's
//                              internals, in place on y (+ the dispatch's forward pass)
//   loss forward / loss backward   x (from here on), y, hn, rstd (+ d_hn); every resident boundary;
//                              the vocabulary loss's forward / backward phase
//   final norm backward        x (taking dy), y, rstd, d_hn; every resident boundary
//   backward mlp / backward dense mlp   the last MoE / dense layer's backward: x (the
//                              one gradient buffer: every layer's backward runs in
//                              place on it), the resident boundaries not yet freed,
//                              the attention's kept o and lse, the MLP sublayer's
//                              backward with its input's row tile (no mid: the tile's
//                              rows of x + o Wo^T are written as it starts) (+ the
//                              dispatch's backward pass)
//   backward attention recompute project / backward attention recompute   the last
//                              layer's attention forward (its projections, its kernel
//                              unless keep_attention kept o)
//   backward attention output / backward attention / backward attention project
//                              its backward (o_proj's, the kernel's, the projections'),
//                              beside the same
//   optimizer                  the persistent buffers (the step allocates nothing)
//   loss eval                  with `evaluates`: the held-out loss's forward (x, y,
//                              rstd and the vocabulary loss's plain forward, which a
//                              one-rank Ring-DTP group runs unfused)
// Forward-order resident counts grow with the layer index and backward-order ones
// shrink, so the last layer of each kind is that kind's worst moment: every phase is
// one real moment, and device_peak_total() is the true simultaneous peak as long as
// every MoE layer's dispatch uses the same sizes (`dispatch`, or the estimate); with
// per-layer sizes (`dispatch_layers`) every MoE layer is its own pair of phases.
// A rank with no tokens builds no stack (no ring, no boundaries) but still runs the
// dispatch, which is what its phases then hold.
//
// Precision: in.schedules.precision, as the model reads it. Every spec function gets it
// (bf16 temporaries such as linear tiles, attention's o32/dq32/dkv32, the vocab's
// g16/d_hidden32 and the dispatch's expert tile are 0 bytes under f32, so the f32
// footprint is the one of before the bf16 form, byte for byte). Under bf16 the batch
// buffers (x, y, hn, d_hn), the checkpoint boundaries (ring, residents,
// host slots), every layer's activations, the dispatch's rows, the
// parameters the model computes with (FSDP shard and gathered slots, the stores' params,
// the trainer's param shard) and the optimizer's param staging are 2 bytes an element;
// gradients (FSDP, stores, trainer shard), the reduce scratch, the fp32 master, m and v,
// rstd, the aux state, the vocab logits and statistics stay 4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/model/model_config.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/schedules/optimizer_options.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/train/process_groups.h"

namespace peakbound {

struct TrainFootprintInputs {
  ModelConfig model;
  ParallelLayout layout;
  int world = 1;
  int rank = 0;
  std::int64_t sequences = 1;  // sequences per rank per micro-batch
  std::int64_t seq_len = 0;    // the whole sequence's tokens (a rank holds its zigzag shard under layout.cp)
  // Every rank's sequences (world order) when they differ (ranks without tokens, a
  // ragged last batch); empty: `sequences` on every rank. The vocabulary loss sizes
  // its buffers by its group's token counts, the rest by this rank's.
  std::vector<std::int64_t> rank_sequences;
  ModelSchedules schedules;
  std::string optimizer = "device";  // an optimizer_schedule_names() entry
  OptimizerOptions optimizer_options;
  // Routing imbalance used for the dispatch estimate (planning), at most what the layout
  // allows: EP x min(k, E/EP) / k (every source's copies of a token at one rank).
  double skew = 1.0;
  // Measured per-layer maximum sizes (tests: dispatch_sizes_max over the MoE layers'
  // DispatchStats::sizes), used for every MoE layer; unset: dispatch_sizes_estimate
  // at `skew` for the most tokens a rank of this rank's expert group holds (the group
  // sizes its exchange for its largest source).
  std::optional<DispatchSizes> dispatch;
  // Measured sizes of each MoE layer, in layer order (tests; overrides `dispatch`).
  // Layers route differently, so the busiest dispatch need not be the last layer's,
  // where the most boundaries are live: with these every MoE layer gets its own
  // phases ("forward mlp (layer l)", the last MoE layer's staying "forward mlp"), and
  // the total is exact.
  std::vector<DispatchSizes> dispatch_layers;
  // Whether the run also evaluates a held-out loss (`train` with --eval-batches > 0):
  // adds the "loss eval" phase (one-rank Ring-DTP's unfused forward holds more vocab
  // memory than its fused training step).
  bool evaluates = false;
};

// Throws InvalidArgument for a model the trainer refuses (check_trainable), a layout
// that does not divide the world or E, a rank outside the world, sequences < 0 or
// seq_len < 1, an unknown optimizer schedule, dispatch_layers or rank_sequences of
// the wrong length.
Footprint train_footprint(const TrainFootprintInputs& in);

// Field by field maximum (double_buffered: any) of several ranks' or layers' sizes.
DispatchSizes dispatch_sizes_max(const std::vector<DispatchSizes>& sizes);

}  // namespace peakbound
