// The device memory of one MoE dispatch pass (standard EP, LLEP, PipelinedLLEP), as a
// pure function of the shapes and of a few sizes that the routing plan determines.
//
//   DispatchSizes   (moe_plan.h) what the plan decides for one rank: the most rows sent and received
//                   in one round, whether rounds are double-buffered, how many
//                   lent experts it holds (foreign) and lends out (lent), its tokens.
//                   The runtime fills it from its MoePlan (dispatch_sizes); the planner
//                   from shapes and knobs (dispatch_sizes_estimate).
//   dispatch_buffers  every Component::dispatch buffer of a forward or backward pass;
//                   MoeDispatch allocates exactly these, nothing beside them.
//   dispatch_footprint  phases "forward" and "backward": what is live together at each
//                   pass's peak (a pass first exchanges lent weights, then runs its rounds).
//
// Precision (what MoeDispatch runs): under bf16 the rows exchanged (send, recv, back,
// out, in ops::moe_send_width / moe_result_width elements: H forward, 2H + 2 and H + 2
// backward), the grouped rows, gate/up/act and the lent weights (foreign_weights,
// lend_send) are bf16; the grouped gate weights and their gradients, the lent experts'
// gradients (foreign_grads, grad_return) stay fp32, and the experts' SwiGLU FFN needs its
// fp32 tile (expert_tile, 0 bytes under f32). Under f32 every spec is what the
// elem_bytes = 4 form gives, byte for byte. The elem_bytes forms are the planner's
// estimate for an arbitrary element size: every element (the gate weights and lent
// gradients too) elem_bytes wide, the weight one element, no tile.
//
// Host scratch (plain std::vector, not device memory, not in the footprint): the expert
// ids read back from the device and the copy lists per expert and per destination
// (~ tokens x top-k), the staging of each round's indices (the size of `indices`), the
// plan itself (ep^2 x rounds slices). Everything a kernel reads, the indices included,
// is one of the device buffers below.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/schedules/moe_plan.h"
#include "peakbound/schedules/moe_shape.h"

namespace peakbound {

enum class DispatchPass : std::uint8_t { forward, backward };

// (DispatchSizes, what the plan decides for one rank, is in moe_plan.h.)
// This rank's sizes under `plan` (kind, rounds and pieces already decided).
DispatchSizes dispatch_sizes(const MoePlan& plan, int rank, std::int64_t tokens);

// The plan the runtime runs: make_moe_plan with the rounds' byte cost taken from
// dispatch_footprint (so options.round_bytes bounds exactly what MoeDispatch allocates).
MoePlan dispatch_plan(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, std::uint64_t elem_bytes);
MoePlan dispatch_plan(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, Precision precision);

// Estimated sizes of the busiest rank at model scale, for the planner: every rank routes
// `tokens` x top_k copies (pass the largest rank's tokens under source skew);
// `imbalance` is the busiest rank's load over the mean before spilling (1 = uniform),
// and the sizes reserve for every routing up to it. standard EP receives the busiest
// load at once; LLEP (imbalance >= lambda, ep > 1) caps every rank at alpha x the mean
// plus one spilled piece, or receives a routing's whole load just under lambda (which
// does not spill), whichever is more; PipelinedLLEP takes that in R = ceil(copies /
// cap) rounds, each at most cap copies per source plus up to ep rows of rounding per
// round. lent counts min_spill-sized pieces plus one last piece per expert; foreign is
// bounded by a helper's load alone (a last piece can be one copy), so at most E - E/EP,
// and by max_lent when set. With round_bytes, PipelinedLLEP's per-source cap is the
// largest whose estimated sizes' footprint fits the budget (as make_moe_plan does).
DispatchSizes dispatch_sizes_estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens,
                                      double imbalance, const DispatchOptions& options,
                                      std::uint64_t elem_bytes = sizeof(float));
DispatchSizes dispatch_sizes_estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens,
                                      double imbalance, const DispatchOptions& options, Precision precision);

struct DispatchBuffers {
  // Lent weights: held for the whole pass; their gradients in backward.
  BufferSpec foreign_weights, foreign_grads;
  // The owner's staging of the weights it lends and their local slots (i64), freed
  // before the rounds start.
  BufferSpec lend_send, lend_index;
  // Round exchange, `exchange_copies` of each (2 when double-buffered). Rows carry
  // [x] forward, [x | dy | gate weight] backward, and come back as [out] forward,
  // [dx | d gate weight] backward. No row carries its expert id: the receiver derives
  // every row's expert from the plan.
  BufferSpec send, recv, back, out;
  // A round's indices (i64), one per exchange copy: the copies packed (max_sent), the
  // grouping permutation (max_received), the copies unpacked with their order by token
  // and its segment starts (3 x max_sent + 1).
  BufferSpec indices;
  int exchange_copies = 1;
  // Expert compute on one round's rows grouped by expert; backward also the grouped
  // gate weights and their gradients (2 x max_received).
  BufferSpec x_grouped, dy_grouped, gate_weights, gate, up, act, out_grouped;
  // bf16: the experts' fp32 linear tile (swiglu_ffn_buffers' tile of max_received rows);
  // 0 bytes under f32 and in the elem_bytes forms.
  BufferSpec expert_tile;
  // Backward: the helpers' weight gradients arriving back at the owner.
  BufferSpec grad_return;

  // Bytes live while the lent weights are exchanged / while the rounds run.
  std::uint64_t lend_bytes() const;
  std::uint64_t rounds_bytes() const;
};

DispatchBuffers dispatch_buffers(const MoeShape& shape, const DispatchSizes& sizes, DispatchPass pass,
                                 std::uint64_t elem_bytes);
DispatchBuffers dispatch_buffers(const MoeShape& shape, const DispatchSizes& sizes, DispatchPass pass,
                                 Precision precision);

// Keeping the experts' intermediates (MoeDispatch's `kept`, ModelSchedules::keep_experts):
// what the forward computes for `rows` rows (DispatchSizes::computed) and the backward
// would otherwise compute again, as four planes [gate | up | act] [R, F] and out [R, H]
// in the activation dtype, Component::dispatch, R = dispatch_kept_rows(rows): rows
// rounded up so that the store is whole Arena granules (its bytes are what the Arena
// reserves, so several stores, one per row tile, add up to the store of their rows'
// sum). Held from a pass's forward to its backward, beside every pass's own buffers.
std::int64_t dispatch_kept_rows(const MoeShape& shape, std::int64_t rows, Precision precision);
BufferSpec dispatch_kept_buffer(const MoeShape& shape, std::int64_t rows, Precision precision);
// The planner's form: every element elem_bytes wide.
BufferSpec dispatch_kept_buffer(const MoeShape& shape, std::int64_t rows, std::uint64_t elem_bytes);

// Phases "forward" and "backward", Component::dispatch on the device, each the larger
// of the pass's two live sets (lend exchange, rounds).
Footprint dispatch_footprint(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes);
Footprint dispatch_footprint(const MoeShape& shape, const DispatchSizes& sizes, Precision precision);
// Its device peak (the larger phase): what options.round_bytes bounds.
std::uint64_t dispatch_peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes);
std::uint64_t dispatch_peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, Precision precision);

}  // namespace peakbound
