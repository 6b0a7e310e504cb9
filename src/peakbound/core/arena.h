// Arena: the device's working set, fixed at launch. One region of `capacity` bytes
// (on CUDA one cudaMalloc, on the CPU device one reserved mapping) from which every
// device allocation is placed, best fit among free blocks, aligned to 256 bytes.
// Staggering: with a stagger reserve (the region then spans capacity + reserve
// bytes), a request of at least kStaggerMin bytes starts at the next of
// kStaggerSlots offsets within a 4 KiB page (0, 256, 512, ... in turn), so buffers
// placed back to back with power-of-two sizes do not all start at the same offset in
// their pages, where streaming them side by side (AdamW's master, m, v, gradient and
// parameter) collides in the same cache sets and trips the CPU's 4K-aliasing check
// (3-4x slower). Best fit picks the block for the unshifted size; the bytes skipped
// before the buffer stay a free block. The ledger counts the request (rounded to 256)
// only, never the shift, so measured component peaks equal the footprints and the
// budget is unchanged; the shifts of live buffers never total more than the reserve,
// so requests that fit the budget placed back to back still fit. The high-water
// offset shows the shifts (it can pass the capacity by up to the reserve).
// A MemoryLedger tags each allocation with its Component, so the report shows live
// and peak bytes per component, the breakdown at the global peak, and the high-water
// offset (how far into the region placement reached: fragmentation made visible).
// With a null base the Arena only measures: offsets are computed, no memory is
// touched (the planner uses this to lay out a step before running it).
// Recording (off by default, one branch when off): between start_timeline() and
// take_timeline() every allocate and release is appended to a MemoryTimeline
// (core/memory_timeline.h) with the current phase (set_phase, or MemoryPhase) and the
// time, so a step's memory can be drawn over time.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/buffer.h"
#include "peakbound/core/ledger.h"
#include "peakbound/core/memory_timeline.h"

namespace peakbound {

class Arena final : public Allocator {
 public:
  static constexpr std::uint64_t kAlignment = 256;
  // Staggering (see above): requests from kStaggerMin bytes start at offset
  // (k % kStaggerSlots) * kAlignment within a kStaggerPeriod page, k counting the
  // large placements; each shift is below kStaggerPeriod. kStaggerReserve is what
  // a device grants: room for a few hundred shifted buffers.
  static constexpr std::uint64_t kStaggerMin = 64 * 1024;
  static constexpr std::uint64_t kStaggerPeriod = 4096;
  static constexpr std::uint64_t kStaggerSlots = kStaggerPeriod / kAlignment;
  static constexpr std::uint64_t kStaggerReserve = 1ull << 20;

  // `base` may be null (measure-only); otherwise it spans capacity + stagger_reserve
  // bytes. The budget is the capacity; stagger_reserve 0 places unshifted.
  Arena(std::string name, std::uint64_t capacity, void* base, Location loc = Location::device,
        std::uint64_t stagger_reserve = 0);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() override;

  // Best-fit placement; throws OutOfBudget when the budget or the largest free block is short.
  Buffer allocate(Component c, std::uint64_t bytes) override;
  Location location() const override { return loc_; }

  std::uint64_t capacity() const { return capacity_; }
  // Whether p lies in the region (capacity plus the stagger reserve).
  bool holds(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return base_ && c >= base_ && c < base_ + capacity_ + reserve_;
  }
  std::uint64_t stagger_reserve() const { return reserve_; }
  std::uint64_t high_water_offset() const;
  // The largest free block, at most the unspent budget.
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

  // The memory timeline. start_timeline begins recording (again, from an empty
  // timeline holding what is live now); take_timeline stops and hands it over.
  void start_timeline(int rank = 0, int world = 1,
                      std::uint64_t max_events = MemoryTimeline::kDefaultMaxEvents);
  MemoryTimeline take_timeline();
  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }
  // The current phase by name (interned); returns the previous phase's id, for
  // restore_phase. Both do nothing (and return 0) when not recording.
  std::uint32_t set_phase(std::string_view name);
  void restore_phase(std::uint32_t id);
  // Step marks: a step's begin and end (time and event index).
  void begin_step(std::int64_t step);
  void end_step();

 protected:
  void release(const Allocation& a) noexcept override;

 private:
  void insert_free(std::uint64_t offset, std::uint64_t size);
  void erase_free(std::uint64_t offset, std::uint64_t size);

  mutable std::mutex mu_;
  std::uint64_t capacity_;
  std::uint64_t reserve_;
  char* base_;
  Location loc_;
  MemoryLedger ledger_;
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;             // offset -> size
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size_;    // (size, offset)
  std::uint64_t high_water_ = 0;
  std::uint64_t live_allocations_ = 0;
  std::uint64_t large_placements_ = 0;         // picks the next stagger slot
  std::uint64_t shifted_ = 0;                  // the shifts of live buffers, at most reserve_
  std::map<std::uint64_t, std::uint64_t> shift_at_;  // offset of a shifted live buffer -> shift
  // The timeline, when recording.
  void record(Component c, std::int64_t delta);
  double seconds() const;
  std::atomic<bool> recording_{false};
  std::unique_ptr<MemoryTimeline> timeline_;
  std::uint32_t phase_ = 0;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace peakbound
