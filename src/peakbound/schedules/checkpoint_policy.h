// Where a checkpointed stack keeps its L boundaries (block l's input, kept until
// block l's backward), and the selective policy that decides it.
//
// Boundaries [0, L) split into three ranges, by index:
//   [0, O)     offloaded: copied to host after block l's forward, prefetched back in
//              backward into a ring slot;
//   [O, M)     ring tail: the last R boundaries cycled through the ring are never
//              overwritten in forward, so they stay in their slots, no copy needed;
//   [M, L)     resident: K = L - M dedicated device buffers (last layers first, since
//              backward needs them first).
// The ring has R = min(prefetch_depth + 2, M) slots, allocated once: in forward a
// slot is rewritten only D blocks after its D2H was issued, in backward a freed slot
// is refilled at once, D + 1 blocks before it is needed. With K = L nothing moves and
// SCO is the resident baseline.
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace peakbound {

struct CheckpointPlacement {
  std::int64_t layers = 0;          // L
  std::int64_t prefetch_depth = 0;  // D
  std::int64_t resident = 0;        // K: dedicated device buffers, the last K boundaries
  std::int64_t ring_slots = 0;      // R
  std::int64_t offloaded = 0;       // O: boundaries that make the host round trip
  std::uint64_t boundary_bytes = 0; // one boundary as the Arena reserves it (aligned)

  // Boundaries that go through the ring: M = L - K.
  std::int64_t ringed() const { return layers - resident; }
  // The checkpoint component's device peak this placement implies.
  std::uint64_t device_bytes() const;
  // Host bytes for the offloaded boundaries.
  std::uint64_t host_bytes() const;
  nlohmann::json to_json() const;
};

// Ring slots for a prefetch depth: D + 2 (see above). Throws InvalidArgument if D < 1.
std::int64_t ring_slots_for(std::int64_t prefetch_depth);

// Every boundary in its own device buffer: the `resident` baseline.
CheckpointPlacement place_all_resident(std::int64_t layers, std::uint64_t boundary_bytes);

// SCO keeping the last `resident_layers` boundaries on the device (--resident-layers).
// Throws InvalidArgument if resident_layers is outside [0, layers] or D < 1.
CheckpointPlacement place_sco(std::int64_t layers, std::uint64_t boundary_bytes,
                              std::int64_t prefetch_depth, std::int64_t resident_layers);

// The selective policy: as many resident boundaries (last layers first) as
// `device_budget` bytes of checkpoint memory allow beside the ring; everything
// resident if all L fit. Throws OutOfBudget when not even the ring fits.
CheckpointPlacement place_sco_within(std::int64_t layers, std::uint64_t boundary_bytes,
                                     std::int64_t prefetch_depth, std::uint64_t device_budget);

// The Arena's reservation for `bytes` (rounded up to its alignment).
std::uint64_t arena_rounded(std::uint64_t bytes);

}  // namespace peakbound
