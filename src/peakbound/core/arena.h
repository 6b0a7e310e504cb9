// Arena: the device's working set, fixed at launch. One region of `capacity` bytes
// (on CUDA one cudaMalloc, on the CPU device one reserved mapping) from which every
// device allocation is placed, best fit among free blocks, aligned to 256 bytes.
// A MemoryLedger tags each allocation with its Component, so the report shows live
// and peak bytes per component, the breakdown at the global peak, and the high-water
// offset (how far into the region placement reached: fragmentation made visible).
// With a null base the Arena only measures: offsets are computed, no memory is
// touched (the planner uses this to lay out a step before running it).
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/buffer.h"
#include "peakbound/core/ledger.h"

namespace peakbound {

class Arena final : public Allocator {
 public:
  static constexpr std::uint64_t kAlignment = 256;

  // `base` may be null (measure-only). The budget is the capacity.
  Arena(std::string name, std::uint64_t capacity, void* base, Location loc = Location::device);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() override;

  // Best-fit placement; throws OutOfBudget when the budget or the largest free block is short.
  Buffer allocate(Component c, std::uint64_t bytes) override;
  Location location() const override { return loc_; }

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t high_water_offset() const;
  std::uint64_t largest_free_block() const;
  std::uint64_t live() const;
  std::uint64_t peak() const;
  std::uint64_t live(Component c) const;
  std::uint64_t peak(Component c) const;
  ComponentBytes peak_breakdown() const;
  // Peaks (and the high-water offset) restart from the current state.
  void reset_peaks();
  // A copy of the ledger, for reports.
  MemoryLedger ledger() const;

  // The ledger's fields plus capacity_bytes, high_water_offset_bytes, free_blocks,
  // largest_free_block_bytes.
  nlohmann::json report_json() const;
  std::string report_table() const;

 protected:
  void release(const Allocation& a) noexcept override;

 private:
  void insert_free(std::uint64_t offset, std::uint64_t size);
  void erase_free(std::uint64_t offset, std::uint64_t size);

  mutable std::mutex mu_;
  std::uint64_t capacity_;
  char* base_;
  Location loc_;
  MemoryLedger ledger_;
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;             // offset -> size
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size_;    // (size, offset)
  std::uint64_t high_water_ = 0;
  std::uint64_t live_allocations_ = 0;
};

}  // namespace peakbound
