#include "peakbound/schedules/checkpoint_policy.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

std::uint64_t CheckpointPlacement::device_bytes() const {
  return static_cast<std::uint64_t>(resident + ring_slots) * boundary_bytes;
}

std::uint64_t CheckpointPlacement::host_bytes() const {
  return static_cast<std::uint64_t>(offloaded) * boundary_bytes;
}

nlohmann::json CheckpointPlacement::to_json() const {
  return {{"layers", layers},
          {"prefetch_depth", prefetch_depth},
          {"resident_layers", resident},
          {"ring_slots", ring_slots},
          {"ring_tail_layers", ringed() - offloaded},
          {"offloaded_layers", offloaded},
          {"boundary_bytes", boundary_bytes},
          {"planned_checkpoint_device_bytes", device_bytes()},
          {"planned_checkpoint_host_bytes", host_bytes()}};
}

std::uint64_t arena_rounded(std::uint64_t bytes) {
  return (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
}

std::int64_t ring_slots_for(std::int64_t prefetch_depth) {
  if (prefetch_depth < 1)
    throw InvalidArgument("prefetch depth must be at least 1 (got " + std::to_string(prefetch_depth) + ")");
  return prefetch_depth + 2;
}

CheckpointPlacement place_all_resident(std::int64_t layers, std::uint64_t boundary_bytes) {
  PB_CHECK(layers >= 1);
  CheckpointPlacement p;
  p.layers = layers;
  p.resident = layers;
  p.boundary_bytes = arena_rounded(boundary_bytes);
  return p;
}

CheckpointPlacement place_sco(std::int64_t layers, std::uint64_t boundary_bytes,
                              std::int64_t prefetch_depth, std::int64_t resident_layers) {
  PB_CHECK(layers >= 1);
  const std::int64_t full_ring = ring_slots_for(prefetch_depth);
  if (resident_layers < 0 || resident_layers > layers)
    throw InvalidArgument("--resident-layers must be between 0 and the layer count " + std::to_string(layers) +
                          " (got " + std::to_string(resident_layers) + ")");
  CheckpointPlacement p;
  p.layers = layers;
  p.prefetch_depth = prefetch_depth;
  p.resident = resident_layers;
  p.boundary_bytes = arena_rounded(boundary_bytes);
  const std::int64_t m = layers - resident_layers;
  p.ring_slots = std::min(full_ring, m);
  p.offloaded = m - p.ring_slots;
  return p;
}

CheckpointPlacement place_sco_within(std::int64_t layers, std::uint64_t boundary_bytes,
                                     std::int64_t prefetch_depth, std::uint64_t device_budget) {
  PB_CHECK(layers >= 1);
  const std::int64_t ring = ring_slots_for(prefetch_depth);
  const std::uint64_t b = arena_rounded(boundary_bytes);
  const auto fit = static_cast<std::int64_t>(std::min<std::uint64_t>(device_budget / std::max<std::uint64_t>(b, 1),
                                                                     static_cast<std::uint64_t>(layers)));
  // All L fit: nothing moves. Otherwise the ring takes R of the slots the budget holds.
  if (fit >= layers) return place_sco(layers, boundary_bytes, prefetch_depth, layers);
  if (fit < ring)
    throw OutOfBudget("checkpoint budget " + format_bytes(static_cast<double>(device_budget)) + " holds " +
                      std::to_string(fit) + " boundaries of " + format_bytes(static_cast<double>(b)) +
                      ", but SCO with prefetch depth " + std::to_string(prefetch_depth) + " needs a ring of " +
                      std::to_string(ring) + ": raise the checkpoint budget to " +
                      format_bytes(static_cast<double>(static_cast<std::uint64_t>(ring) * b)) +
                      " or lower the prefetch depth");
  return place_sco(layers, boundary_bytes, prefetch_depth, fit - ring);
}

}  // namespace peakbound
