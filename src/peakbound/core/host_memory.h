// HostMemory: host allocations accounted like the device Arena (per-component live
// and peak bytes, breakdown at the peak), under their own budget, unlimited by
// default. Memory comes from the system allocator, 256-byte aligned, unless the
// device supplies its pages (Device::host_pages): a CUDA device gives page-locked
// memory (cudaHostAlloc), so host<->device copies run at PCIe speed and overlap
// compute. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/buffer.h"
#include "peakbound/core/ledger.h"

namespace peakbound {

// Where HostMemory's pages come from when not from the system allocator.
class HostPages {
 public:
  virtual ~HostPages() = default;
  // bytes (a multiple of 256) aligned to 256, or nullptr when refused.
  virtual void* allocate(std::uint64_t bytes) noexcept = 0;
  virtual void release(void* p) noexcept = 0;
  virtual const char* kind() const = 0;  // "pinned"
};

class HostMemory final : public Allocator {
 public:
  // pages: nullptr for the system allocator ("pageable"), else the device's (outlives this).
  explicit HostMemory(std::uint64_t budget = MemoryLedger::kUnlimited, std::string name = "host",
                      HostPages* pages = nullptr);
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  Buffer allocate(Component c, std::uint64_t bytes) override;
  Location location() const override { return Location::host; }
  const char* pages_kind() const { return pages_ ? pages_->kind() : "pageable"; }

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
  HostPages* pages_ = nullptr;
};

}  // namespace peakbound
