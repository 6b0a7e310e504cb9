// Footprint: the memory one schedule or layer holds, per Component, on the device and
// on the host, in each of its phases ("forward", "backward", ...). It is the single
// source of a schedule's sizes: the schedule's runtime allocates every buffer from a
// BufferSpec that its footprint function returns, and the planner composes the same
// functions at model scale, so the plan printed at launch and the Arena's measured
// peaks cannot drift apart (tests check measured == footprint for each schedule).
//
// A phase lists what is live together; the footprint's peak is the maximum over its
// phases of their totals, and per component the maximum over phases. Bytes are what an
// allocator reserves (the Arena rounds each request up to its 256-byte alignment), so a
// measured peak equals the footprint exactly. Sums and products are checked: a size
// that does not fit in 64 bits is an InvalidArgument, never a wrapped number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/ledger.h"

namespace peakbound {

// Bytes an Arena reserves for a request of `bytes` (0 for 0).
std::uint64_t arena_reserved(std::uint64_t bytes);

// One buffer a runtime allocates: its component and requested size. Runtimes call
// `device.allocate(spec.component, spec.bytes)` (or host.allocate) with it.
struct BufferSpec {
  Component component = Component::workspace;
  std::uint64_t bytes = 0;

  std::uint64_t reserved() const { return arena_reserved(bytes); }
};

// `count` elements of `elem_bytes` each, checked for overflow.
BufferSpec buffer_spec(Component c, std::uint64_t count, std::uint64_t elem_bytes);

class Footprint {
 public:
  struct Phase {
    std::string name;
    ComponentBytes device{};
    ComponentBytes host{};
    std::uint64_t device_total() const;
    std::uint64_t host_total() const;
  };

  Footprint() = default;
  explicit Footprint(std::string name) : name_(std::move(name)) {}

  // Adds `count` x spec (reserved bytes) to a phase, created on first use, in order.
  Footprint& device(std::string_view phase, const BufferSpec& spec, std::uint64_t count = 1);
  Footprint& host(std::string_view phase, const BufferSpec& spec, std::uint64_t count = 1);
  // Adds another footprint's phases into this one's, phase by phase under the same names.
  Footprint& merge(const Footprint& other);

  const std::string& name() const { return name_; }
  const std::vector<Phase>& phases() const { return phases_; }
  bool has_phase(std::string_view phase) const;
  // Throws InternalError if there is no such phase.
  const Phase& phase(std::string_view phase) const;

  // Per component, the maximum over phases.
  ComponentBytes device_peak() const;
  ComponentBytes host_peak() const;
  std::uint64_t device_peak(Component c) const;
  std::uint64_t host_peak(Component c) const;
  // The maximum over phases of the phase's total.
  std::uint64_t device_peak_total() const;
  std::uint64_t host_peak_total() const;

  // {name, phases: [{name, device: {component: bytes}, host: {...}}], device_peak_bytes, host_peak_bytes}
  nlohmann::json to_json() const;

 private:
  Phase& at(std::string_view phase);

  std::string name_;
  std::vector<Phase> phases_;
};

// The device budget `--device-memory auto` means, everywhere: a footprint's planned
// device peak plus `unplanned` (bytes a command holds outside every footprint, such as a
// benchmark's inputs), plus 1/16 headroom and the Arena's 8 MiB placement reserve.
std::uint64_t auto_device_budget(std::uint64_t planned_peak, std::uint64_t unplanned = 0);

// Overflow-checked arithmetic on sizes; throws InvalidArgument naming `what`.
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what = "a size");
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what = "a size");

}  // namespace peakbound
