#include "peakbound/schedules/checkpoint_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

std::string_view checkpoint_schedule_name(CheckpointSchedule s) {
  switch (s) {
    case CheckpointSchedule::resident: return "resident";
    case CheckpointSchedule::sco: return "sco";
  }
  PB_CHECK_MSG(false, "unknown checkpoint schedule");
}

CheckpointSchedule parse_checkpoint_schedule(std::string_view name) {
  if (name == "resident") return CheckpointSchedule::resident;
  if (name == "sco") return CheckpointSchedule::sco;
  throw InvalidArgument("unknown checkpoint schedule '" + std::string(name) + "' (use resident or sco)");
}

void validate_link_gbps(double gbps) {
  if (gbps == 0) return;
  if (!std::isfinite(gbps) || !(gbps >= CheckpointOptions::kMinLinkGbps)) {
    char min[32], got[32];
    std::snprintf(min, sizeof min, "%g", CheckpointOptions::kMinLinkGbps);
    std::snprintf(got, sizeof got, "%g", gbps);
    throw InvalidArgument(std::string("checkpoint link_gbps must be 0 (off) or an emulated bandwidth of at least ") +
                          min + " GB/s (got " + got + "); slower links would make each copy take minutes to hours");
  }
}

void validate_checkpoint_options(const CheckpointOptions& o) {
  ring_slots_for(o.prefetch_depth);
  if (o.group_layers < 1)
    throw InvalidArgument("checkpoint group_layers must be >= 1 (got " + std::to_string(o.group_layers) +
                          "); 1 keeps a boundary per layer");
  if (o.resident_layers && *o.resident_layers < 0)
    throw InvalidArgument("checkpoint resident_layers must be >= 0 (got " + std::to_string(*o.resident_layers) +
                          "); leave it unset to let the policy choose");
  validate_link_gbps(o.link_gbps);
}

std::uint64_t CheckpointPlacement::device_bytes() const {
  return checked_mul(static_cast<std::uint64_t>(device_boundaries()), boundary_bytes, "checkpoint device bytes");
}

std::uint64_t CheckpointPlacement::host_bytes() const {
  return checked_mul(static_cast<std::uint64_t>(offloaded), boundary_bytes, "checkpoint host bytes");
}

nlohmann::json CheckpointPlacement::to_json() const {
  return {{"layers", layers},  // boundaries: checkpoint groups
          {"prefetch_depth", prefetch_depth},
          {"resident_layers", resident},
          {"ring_slots", ring_slots},
          {"ring_tail_layers", ringed() - offloaded},
          {"offloaded_layers", offloaded},
          {"boundary_bytes", boundary_bytes},
          {"planned_checkpoint_device_bytes", device_bytes()},
          {"planned_checkpoint_host_bytes", host_bytes()}};
}

std::int64_t ring_slots_for(std::int64_t prefetch_depth) {
  if (prefetch_depth < 0)
    throw InvalidArgument("checkpoint prefetch_depth must be >= 0 (got " + std::to_string(prefetch_depth) +
                          "); 0 is a one-slot ring whose copies wait");
  return prefetch_depth + 1;
}

namespace {

void check_layers(std::int64_t layers) {
  if (layers < 1) throw InvalidArgument("checkpoint layers must be >= 1 (got " + std::to_string(layers) + ")");
}

// The first checkpoint group's blocks (the remainder; the others hold G each).
std::int64_t first_group_count(std::int64_t layers, std::int64_t group_layers, std::int64_t groups) {
  return layers - (groups - 1) * group_layers;
}

}  // namespace

std::int64_t checkpoint_group_count(std::int64_t layers, std::int64_t group_layers) {
  check_layers(layers);
  if (group_layers < 1)
    throw InvalidArgument("checkpoint group_layers must be >= 1 (got " + std::to_string(group_layers) + ")");
  return (layers + group_layers - 1) / group_layers;
}

CheckpointGroup checkpoint_group(std::int64_t layers, std::int64_t group_layers, std::int64_t k) {
  const std::int64_t n = checkpoint_group_count(layers, group_layers);
  if (k < 0 || k >= n)
    throw InvalidArgument("checkpoint group " + std::to_string(k) + " is not in [0, " + std::to_string(n) + ")");
  const std::int64_t first_count = first_group_count(layers, group_layers, n);
  if (k == 0) return {0, first_count};
  return {first_count + (k - 1) * group_layers, group_layers};
}

std::int64_t checkpoint_group_of(std::int64_t layers, std::int64_t group_layers, std::int64_t l) {
  const std::int64_t n = checkpoint_group_count(layers, group_layers);
  if (l < 0 || l >= layers)
    throw InvalidArgument("checkpoint block " + std::to_string(l) + " is not in [0, " + std::to_string(layers) + ")");
  const std::int64_t first_count = first_group_count(layers, group_layers, n);
  return l < first_count ? 0 : 1 + (l - first_count) / group_layers;
}

std::vector<CheckpointBlockCall> checkpoint_backward_calls(std::int64_t layers, std::int64_t group_layers) {
  std::vector<CheckpointBlockCall> calls;
  for (std::int64_t k = checkpoint_group_count(layers, group_layers) - 1; k >= 0; --k) {
    const CheckpointGroup g = checkpoint_group(layers, group_layers, k);
    for (std::int64_t l = g.first; l + 1 < g.first + g.count; ++l) calls.push_back({l, true});
    for (std::int64_t l = g.first + g.count - 1; l >= g.first; --l) calls.push_back({l, false});
  }
  return calls;
}

std::int64_t checkpoint_backward_next(std::int64_t layers, std::int64_t group_layers, CheckpointBlockCall call) {
  const std::int64_t k = checkpoint_group_of(layers, group_layers, call.block);
  if (call.recompute) return call.block + 1;
  if (call.block != checkpoint_group(layers, group_layers, k).first) return call.block - 1;
  return k == 0 ? -1 : checkpoint_group(layers, group_layers, k - 1).first;
}

CheckpointPlacement place_all_resident(std::int64_t layers, std::uint64_t boundary_bytes) {
  check_layers(layers);
  CheckpointPlacement p;
  p.layers = layers;
  p.resident = layers;
  p.boundary_bytes = arena_reserved(boundary_bytes);
  return p;
}

CheckpointPlacement place_sco(std::int64_t layers, std::uint64_t boundary_bytes,
                              std::int64_t prefetch_depth, std::int64_t resident_layers) {
  check_layers(layers);
  const std::int64_t full_ring = ring_slots_for(prefetch_depth);
  if (resident_layers < 0 || resident_layers > layers)
    throw InvalidArgument("checkpoint resident_layers must be between 0 and the layer count " + std::to_string(layers) +
                          " (got " + std::to_string(resident_layers) + ")");
  CheckpointPlacement p;
  p.layers = layers;
  p.prefetch_depth = prefetch_depth;
  p.resident = resident_layers;
  p.boundary_bytes = arena_reserved(boundary_bytes);
  const std::int64_t m = layers - resident_layers;
  p.ring_slots = std::min(full_ring, m);
  p.offloaded = m - p.ring_slots;
  return p;
}

CheckpointPlacement place_sco_within(std::int64_t layers, std::uint64_t boundary_bytes,
                                     std::int64_t prefetch_depth, std::uint64_t device_budget) {
  check_layers(layers);
  const std::int64_t ring = ring_slots_for(prefetch_depth);
  const std::uint64_t b = arena_reserved(boundary_bytes);
  const auto fit = static_cast<std::int64_t>(std::min<std::uint64_t>(device_budget / std::max<std::uint64_t>(b, 1),
                                                                     static_cast<std::uint64_t>(layers)));
  // All L fit: nothing moves. Otherwise the ring takes R of the slots the budget holds.
  if (fit >= layers) return place_sco(layers, boundary_bytes, prefetch_depth, layers);
  if (fit < ring)
    throw OutOfBudget("SCO's checkpoint_budget of " + format_bytes(static_cast<double>(device_budget)) + " holds " +
                      std::to_string(fit) + " boundaries of " + format_bytes(static_cast<double>(b)) +
                      ", but SCO with prefetch_depth " + std::to_string(prefetch_depth) + " needs a ring of " +
                      std::to_string(ring) + ": raise checkpoint_budget to " +
                      format_bytes(static_cast<double>(static_cast<std::uint64_t>(ring) * b)) +
                      " or lower prefetch_depth");
  return place_sco(layers, boundary_bytes, prefetch_depth, fit - ring);
}

CheckpointPlacement place_checkpoints(std::int64_t layers, std::uint64_t boundary_bytes, const CheckpointOptions& o) {
  validate_checkpoint_options(o);
  if (o.schedule == CheckpointSchedule::resident) return place_all_resident(layers, boundary_bytes);
  if (o.resident_layers) return place_sco(layers, boundary_bytes, o.prefetch_depth, *o.resident_layers);
  if (o.checkpoint_budget > 0) return place_sco_within(layers, boundary_bytes, o.prefetch_depth, o.checkpoint_budget);
  return place_sco(layers, boundary_bytes, o.prefetch_depth, 0);
}

CheckpointBuffers checkpoint_buffers(std::int64_t layers, std::uint64_t boundary_elems, std::uint64_t elem_bytes,
                                     const CheckpointOptions& o, bool in_place) {
  check_layers(layers);
  CheckpointBuffers b;
  b.schedule = o.schedule;
  b.boundary = buffer_spec(Component::checkpoints, boundary_elems, elem_bytes);
  b.host_boundary = b.boundary;
  b.grad = buffer_spec(Component::layer, boundary_elems, elem_bytes);
  b.in_place = in_place;
  b.grad_buffers = layers > 1 && !in_place ? 2 : 0;
  validate_checkpoint_options(o);
  b.blocks = layers;
  b.group_layers = o.group_layers;
  b.recompute = std::min(o.group_layers, layers) - 1;
  b.placement = place_checkpoints(checkpoint_group_count(layers, o.group_layers), b.boundary.bytes, o);
  return b;
}

Footprint checkpoint_footprint(const CheckpointBuffers& b) {
  const CheckpointPlacement& p = b.placement;
  Footprint f(std::string("checkpoint ") + std::string(checkpoint_schedule_name(b.schedule)));
  const auto dev = static_cast<std::uint64_t>(p.device_boundaries());
  const auto host = static_cast<std::uint64_t>(p.offloaded);
  for (const char* phase : {"forward", "backward"}) {
    f.device(phase, b.boundary, dev);
    f.host(phase, b.host_boundary, host);
  }
  f.device("backward", b.grad, static_cast<std::uint64_t>(b.grad_buffers));
  f.device("backward", b.boundary, static_cast<std::uint64_t>(b.recompute));
  return f;
}

Footprint checkpoint_footprint(std::int64_t layers, std::uint64_t boundary_elems, std::uint64_t elem_bytes,
                               const CheckpointOptions& o) {
  return checkpoint_footprint(checkpoint_buffers(layers, boundary_elems, elem_bytes, o));
}

}  // namespace peakbound
