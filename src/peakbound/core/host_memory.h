// HostMemory: host allocations accounted like the device Arena (per-component live
// and peak bytes, breakdown at the peak), under their own budget, unlimited by
// default. Memory comes from the system allocator, 256-byte aligned; a CUDA build
// will pin it. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/buffer.h"
#include "peakbound/core/ledger.h"

namespace peakbound {

class HostMemory final : public Allocator {
 public:
  explicit HostMemory(std::uint64_t budget = MemoryLedger::kUnlimited, std::string name = "host");
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  Buffer allocate(Component c, std::uint64_t bytes) override;
  Location location() const override { return Location::host; }

  std::uint64_t live() const;
  std::uint64_t peak() const;
  std::uint64_t peak(Component c) const;
  void reset_peaks();
  MemoryLedger ledger() const;
  nlohmann::json report_json() const;
  std::string report_table() const;

 protected:
  void release(const Allocation& a) noexcept override;

 private:
  mutable std::mutex mu_;
  MemoryLedger ledger_;
};

}  // namespace peakbound
