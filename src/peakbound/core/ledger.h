// MemoryLedger: the accounting half of an allocator. It knows a byte budget and,
// per Component, the live bytes and their peak, plus the global peak together with
// the per-component breakdown at the moment it was reached. It places nothing; the
// Arena (device) and HostMemory (host) own one each. Not thread-safe: owners lock.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/component.h"

namespace peakbound {

using ComponentBytes = std::array<std::uint64_t, kNumComponents>;

class MemoryLedger {
 public:
  static constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

  MemoryLedger(std::string name, std::uint64_t budget);

  // Throws OutOfBudget naming the component, the request, the live breakdown and the budget.
  void reserve(Component c, std::uint64_t bytes);
  void release(Component c, std::uint64_t bytes);
  // Peaks restart from what is live now (to measure one phase).
  void reset_peaks();

  const std::string& name() const { return name_; }
  std::uint64_t budget() const { return budget_; }
  bool unlimited() const { return budget_ == kUnlimited; }
  std::uint64_t live() const { return live_total_; }
  std::uint64_t peak() const { return peak_total_; }
  std::uint64_t live(Component c) const { return live_[idx(c)]; }
  std::uint64_t peak(Component c) const { return peak_[idx(c)]; }
  std::uint64_t live_allocations(Component c) const { return count_[idx(c)]; }
  const ComponentBytes& live_breakdown() const { return live_; }
  const ComponentBytes& peak_breakdown() const { return at_peak_; }

  // "params 8.00 GiB, grads 4.00 GiB" (non-zero entries only; "nothing" if none).
  static std::string breakdown_text(const ComponentBytes& b);
  // The error text for a request this ledger cannot take; `why` adds a cause.
  std::string refusal(Component c, std::uint64_t bytes, const std::string& why) const;

  // Fields: name, budget_bytes (null if unlimited), live_bytes, peak_bytes,
  // components {name: {live_bytes, peak_bytes, at_global_peak_bytes}}.
  nlohmann::json to_json() const;
  // A table with one row per component that was ever used.
  std::string table() const;

 private:
  static std::size_t idx(Component c) { return static_cast<std::size_t>(c); }

  std::string name_;
  std::uint64_t budget_;
  std::uint64_t live_total_ = 0;
  std::uint64_t peak_total_ = 0;
  ComponentBytes live_{};
  ComponentBytes peak_{};
  ComponentBytes at_peak_{};
  ComponentBytes count_{};
};

}  // namespace peakbound
