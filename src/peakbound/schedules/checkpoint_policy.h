// Selective Checkpoint Offload's knobs, where a checkpointed stack keeps its L
// boundaries (block l's input, kept until block l's backward), the selective policy
// that decides it, and the footprint: the one place the stack's sizes come from.
//
// Boundaries [0, L) split into three ranges, by index:
//   [0, O)     offloaded: copied to host as soon as it is written (x's copy, or block
//              l - 1's forward), while block l reads it; prefetched back in backward
//              into a ring slot;
//   [O, M)     ring tail: the last R boundaries cycled through the ring are never
//              overwritten in forward, so they stay in their slots, no copy needed;
//   [M, L)     resident: K = L - M dedicated device buffers (last layers first, since
//              backward needs them first).
// The ring has R = min(prefetch_depth + 1, M) slots, allocated once: in forward a
// slot is rewritten only D blocks after its D2H was issued (the D2H of boundary l
// starts before block l reads it, so block l's compute hides it), in backward a freed
// slot is refilled at once, D blocks before it is needed. At the default D = 1 the
// device holds two boundaries of a checkpointed stack whatever its depth. At D = 0 the
// ring is one slot: every block but the last runs forward in place in it
// (Block::forward_in_place), after the D2H of its input has completed, and in backward
// each boundary is fetched once the block above has finished with the slot: the device
// holds one boundary, and the copies are not hidden (the stack's stall_seconds). With
// K = L nothing moves and SCO is the resident baseline.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/footprint.h"

namespace peakbound {

enum class CheckpointSchedule : std::uint8_t { resident, sco };

std::string_view checkpoint_schedule_name(CheckpointSchedule s);
// Throws InvalidArgument naming the valid schedules.
CheckpointSchedule parse_checkpoint_schedule(std::string_view name);

// Every knob of the checkpointed stack with its one default; the library, the CLI
// flags and the planner all read this struct.
struct CheckpointOptions {
  CheckpointSchedule schedule = CheckpointSchedule::sco;
  // sco: blocks of compute each copy hides behind; the ring holds prefetch_depth + 1
  // (0: one slot, the copies exposed; the blocks must run forward in place).
  std::int64_t prefetch_depth = 1;
  // sco: keep exactly the last K boundaries resident, 0 <= K <= L. Unset: the policy
  // decides from checkpoint_budget.
  std::optional<std::int64_t> resident_layers;
  // sco policy: device bytes for boundaries (ring + resident); 0 = no budget, offload
  // all but the ring.
  std::uint64_t checkpoint_budget = 0;
  // 0 = off; otherwise emulate a host link of this many GB/s (1e9 bytes/s) on the CPU
  // device's copy engine, at least kMinLinkGbps.
  double link_gbps = 0;
  // Blocks per checkpoint group (>= 1): the stack keeps one boundary per group of this many
  // consecutive blocks (the last group full, the first taking the remainder) and, in a
  // group's backward, runs the group's forward again from its boundary (Block::
  // forward_recompute) to the inputs of its other blocks, held on the device until their
  // backward (checkpoint_group_layers, CheckpointBuffers::recompute). ceil(L / G)
  // boundaries instead of L, for up to G - 1 more forwards of a block per step. The blocks
  // of groups of several must run forward in place. 1: a boundary per block.
  std::int64_t group_layers = 1;

  // The slowest emulated link accepted: 1 MB/s, a thousand times slower than any real
  // host link, so a boundary copy takes milliseconds, not the hours a 1e-9 would.
  static constexpr double kMinLinkGbps = 1e-3;
};

// Throws InvalidArgument naming the option ("checkpoint prefetch_depth must be >= 0").
// resident_layers against L is checked by the placement.
void validate_checkpoint_options(const CheckpointOptions& o);
// The link_gbps rule alone (0, or finite and >= kMinLinkGbps).
void validate_link_gbps(double gbps);

// Checkpoint groups of L blocks by G (CheckpointOptions::group_layers): n = ceil(L / G)
// groups, group k its blocks [first, first + count), the last n - 1 of G blocks each and the
// first the remainder (so the stack's last blocks, whose backward comes first and meets the
// most resident boundaries, sit in a full group). Throws InvalidArgument for L < 1 or G < 1.
struct CheckpointGroup {
  std::int64_t first = 0, count = 0;
};
std::int64_t checkpoint_group_count(std::int64_t layers, std::int64_t group_layers);
CheckpointGroup checkpoint_group(std::int64_t layers, std::int64_t group_layers, std::int64_t k);
// The group block l (0 <= l < layers) belongs to. Throws InvalidArgument as above, or for l
// outside [0, layers).
std::int64_t checkpoint_group_of(std::int64_t layers, std::int64_t group_layers, std::int64_t l);

// The calls a checkpointed stack's backward makes of its blocks, in order
// (CheckpointedStack::backward): per group from the last, its blocks but the last forward
// again (Block::forward_recompute, first to last), then every block's backward, last first.
// A caller that runs the blocks without a stack (a rank without tokens, whose collectives
// must pair with its group's) makes the same calls from here.
struct CheckpointBlockCall {
  std::int64_t block = 0;
  bool recompute = false;  // forward_recompute; otherwise backward
};
std::vector<CheckpointBlockCall> checkpoint_backward_calls(std::int64_t layers, std::int64_t group_layers);
// The block the stack's backward computes next after `call` (-1: none): after block l's
// recomputation l + 1; after block l's backward l - 1, unless l opens its group: then the
// previous group's first block (recomputed, or its backward when it is alone).
std::int64_t checkpoint_backward_next(std::int64_t layers, std::int64_t group_layers, CheckpointBlockCall call);

// The placement of a stack's boundaries: one per checkpoint group (`layers` counts them:
// the stack's blocks when group_layers is 1).
struct CheckpointPlacement {
  std::int64_t layers = 0;          // L
  std::int64_t prefetch_depth = 0;  // D
  std::int64_t resident = 0;        // K: dedicated device buffers, the last K boundaries
  std::int64_t ring_slots = 0;      // R
  std::int64_t offloaded = 0;       // O: boundaries that make the host round trip
  std::uint64_t boundary_bytes = 0; // one boundary as the Arena reserves it (aligned)

  // Boundaries that go through the ring: M = L - K.
  std::int64_t ringed() const { return layers - resident; }
  // Device buffers for boundaries: R + K.
  std::int64_t device_boundaries() const { return ring_slots + resident; }
  // The checkpoint component's device peak this placement implies.
  std::uint64_t device_bytes() const;
  // Host bytes for the offloaded boundaries.
  std::uint64_t host_bytes() const;
  nlohmann::json to_json() const;
};

// Ring slots for a prefetch depth: D + 1 (see above). Throws InvalidArgument if D < 0.
std::int64_t ring_slots_for(std::int64_t prefetch_depth);

// Every boundary in its own device buffer: the `resident` baseline.
CheckpointPlacement place_all_resident(std::int64_t layers, std::uint64_t boundary_bytes);

// SCO keeping the last `resident_layers` boundaries on the device.
// Throws InvalidArgument if resident_layers is outside [0, layers] or D < 0.
CheckpointPlacement place_sco(std::int64_t layers, std::uint64_t boundary_bytes,
                              std::int64_t prefetch_depth, std::int64_t resident_layers);

// The selective policy: as many resident boundaries (last layers first) as
// `device_budget` bytes of checkpoint memory allow beside the ring; everything
// resident if all L fit. Throws OutOfBudget when not even the ring fits.
CheckpointPlacement place_sco_within(std::int64_t layers, std::uint64_t boundary_bytes,
                                     std::int64_t prefetch_depth, std::uint64_t device_budget);

// The placement the options choose (schedule, resident_layers, checkpoint_budget).
// Throws InvalidArgument for bad options, OutOfBudget as place_sco_within.
CheckpointPlacement place_checkpoints(std::int64_t layers, std::uint64_t boundary_bytes,
                                      const CheckpointOptions& o);

// The buffers a checkpointed stack allocates, all from here:
//   boundary       device, checkpoints: each of the R ring slots (at construction) and
//                  each of the K resident boundaries (in forward, freed in backward);
//   host_boundary  host, checkpoints: each of the O offloaded boundaries (construction);
//   grad           device, layer: the backward's residual-gradient ping-pong, two
//                  buffers when L > 1 (one block writes dx directly when L = 1); none
//                  when every block's backward runs in place (in_place: the caller's dx
//                  is the one gradient buffer);
//   recompute      device, checkpoints (boundary's spec): the inputs of a group's blocks
//                  but its first, recomputed in its backward: up to `recompute` = (the
//                  largest group) - 1 at once, allocated there and each freed after its
//                  block's backward.
// The placement is over the n checkpoint groups' boundaries.
struct CheckpointBuffers {
  CheckpointSchedule schedule = CheckpointSchedule::sco;
  CheckpointPlacement placement;
  BufferSpec boundary;
  BufferSpec host_boundary;
  BufferSpec grad;
  std::int64_t grad_buffers = 0;
  bool in_place = false;
  std::int64_t blocks = 0;        // L: the stack's blocks
  std::int64_t group_layers = 1;  // G
  std::int64_t recompute = 0;     // min(G, L) - 1
};

// layers L >= 1; boundary_elems: elements of one boundary (tokens x hidden);
// elem_bytes: the activation element size (4 for the f32 runtime, 2 to plan bf16).
// in_place: every block's backward may write dx over dy (Block::backward_in_place).
CheckpointBuffers checkpoint_buffers(std::int64_t layers, std::uint64_t boundary_elems, std::uint64_t elem_bytes,
                                     const CheckpointOptions& o, bool in_place = false);

// Phases, what the stack holds (its blocks' internals and parameters are theirs):
//   "forward"   device checkpoints (R + K) x boundary; host checkpoints O x boundary
//   "backward"  the same, plus device layer grad_buffers x grad and checkpoints
//               recompute x boundary (a full group's backward, its last block's moment)
Footprint checkpoint_footprint(const CheckpointBuffers& b);
Footprint checkpoint_footprint(std::int64_t layers, std::uint64_t boundary_elems, std::uint64_t elem_bytes,
                               const CheckpointOptions& o);

}  // namespace peakbound
