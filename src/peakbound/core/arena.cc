#include "peakbound/core/arena.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

Arena::Arena(std::string name, std::uint64_t capacity, void* base, Location loc, std::uint64_t stagger_reserve)
    : capacity_(capacity / kAlignment * kAlignment),
      reserve_(stagger_reserve / kAlignment * kAlignment),
      base_(static_cast<char*>(base)),
      loc_(loc),
      ledger_(std::move(name), capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) insert_free(0, capacity_ + reserve_);
}

Arena::~Arena() = default;

void Arena::insert_free(std::uint64_t offset, std::uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void Arena::erase_free(std::uint64_t offset, std::uint64_t size) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
}

Buffer Arena::allocate(Component c, std::uint64_t bytes) {
  if (bytes == 0) return Buffer();
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > capacity_)
    throw OutOfBudget(ledger_.refusal(c, bytes, "the request exceeds the whole budget"));
  std::uint64_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto it = free_by_size_.lower_bound({size, 0});
  if (it == free_by_size_.end()) {
    // Either the budget is spent (the ledger says so) or free memory is fragmented.
    if (ledger_.live() + size > capacity_) ledger_.reserve(c, size);  // throws with the breakdown
    std::uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    throw OutOfBudget(ledger_.refusal(
        c, size,
        "free memory is fragmented: " + format_bytes(static_cast<double>(capacity_ - ledger_.live())) +
            " free but the largest free block is " + format_bytes(static_cast<double>(largest))));
  }
  const std::uint64_t block_size = it->first;
  const std::uint64_t block = it->second;
  // Throws with the breakdown when the budget is spent (the region has the reserve on top).
  ledger_.reserve(c, size);
  // Stagger a large placement when the block has room for the shift and the reserve
  // covers it, so the shifts never take budget bytes.
  std::uint64_t shift = 0;
  if (reserve_ > 0 && size >= kStaggerMin) {
    const std::uint64_t target = (large_placements_++ % kStaggerSlots) * kAlignment;
    shift = (target + kStaggerPeriod - block % kStaggerPeriod) % kStaggerPeriod;
    if (block_size - size < shift || shifted_ + shift > reserve_) shift = 0;
  }
  const std::uint64_t offset = block + shift;
  erase_free(block, block_size);
  if (shift > 0) {
    insert_free(block, shift);
    shifted_ += shift;
    shift_at_.emplace(offset, shift);
  }
  if (block_size > size + shift) insert_free(offset + size, block_size - size - shift);
  if (offset + size > high_water_) high_water_ = offset + size;
  ++live_allocations_;
  if (timeline_) record(c, static_cast<std::int64_t>(size));
  Allocation a;
  a.ptr = base_ ? base_ + offset : nullptr;
  a.offset = offset;
  a.bytes = size;
  a.component = c;
  return Buffer(this, a);
}

void Arena::release(const Allocation& a) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.release(a.component, a.bytes);
  --live_allocations_;
  if (timeline_) record(a.component, -static_cast<std::int64_t>(a.bytes));
  if (auto sh = shift_at_.find(a.offset); sh != shift_at_.end()) {
    shifted_ -= sh->second;
    shift_at_.erase(sh);
  }
  std::uint64_t offset = a.offset;
  std::uint64_t size = a.bytes;
  // Coalesce with the free neighbours on both sides.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    std::uint64_t ns = next->second;
    erase_free(next->first, ns);
    size += ns;
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      std::uint64_t po = prev->first, ps = prev->second;
      erase_free(po, ps);
      offset = po;
      size += ps;
    }
  }
  insert_free(offset, size);
}

std::uint64_t Arena::high_water_offset() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

std::uint64_t Arena::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return std::min(largest, capacity_ - ledger_.live());
}

std::uint64_t Arena::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.live();
}

std::uint64_t Arena::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak();
}

std::uint64_t Arena::live(Component c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.live(c);
}

std::uint64_t Arena::peak(Component c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak(c);
}

ComponentBytes Arena::peak_breakdown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak_breakdown();
}

void Arena::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.reset_peaks();
  // The high-water offset restarts at the end of the highest live block: the start
  // of the last free block when that block runs to the end of the region.
  high_water_ = capacity_ + reserve_;
  if (!free_by_offset_.empty()) {
    auto last = std::prev(free_by_offset_.end());
    if (last->first + last->second == capacity_ + reserve_) high_water_ = last->first;
  }
}

MemoryLedger Arena::ledger() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_;
}

nlohmann::json Arena::report_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = ledger_.to_json();
  j["capacity_bytes"] = capacity_;
  j["high_water_offset_bytes"] = high_water_;
  j["free_blocks"] = free_by_offset_.size();
  j["largest_free_block_bytes"] =
      std::min(free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first, capacity_ - ledger_.live());
  j["live_allocations"] = live_allocations_;
  return j;
}

std::string Arena::report_table() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "arena " + ledger_.name() + ": budget " +
                    format_bytes(static_cast<double>(capacity_)) + ", peak " +
                    format_bytes(static_cast<double>(ledger_.peak())) + ", high-water offset " +
                    format_bytes(static_cast<double>(high_water_)) + ", " +
                    std::to_string(free_by_offset_.size()) + " free block(s)\n";
  out += ledger_.table();
  return out;
}

double Arena::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Arena::record(Component c, std::int64_t delta) {
  MemoryTimeline& t = *timeline_;
  if (t.events.size() >= t.max_events) {
    t.truncated = true;
    return;
  }
  t.events.push_back(MemoryEvent{seconds(), delta, phase_, static_cast<std::uint8_t>(c)});
}

void Arena::start_timeline(int rank, int world, std::uint64_t max_events) {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_ = std::make_unique<MemoryTimeline>();
  timeline_->rank = rank;
  timeline_->world = world;
  timeline_->budget_bytes = capacity_;
  timeline_->initial = ledger_.live_breakdown();
  timeline_->max_events = max_events;
  phase_ = 0;
  t0_ = std::chrono::steady_clock::now();
  recording_.store(true, std::memory_order_relaxed);
}

MemoryTimeline Arena::take_timeline() {
  std::lock_guard<std::mutex> lock(mu_);
  recording_.store(false, std::memory_order_relaxed);
  if (!timeline_) return MemoryTimeline{};
  MemoryTimeline t = std::move(*timeline_);
  timeline_.reset();
  phase_ = 0;
  return t;
}

std::uint32_t Arena::set_phase(std::string_view name) {
  if (!recording()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (!timeline_) return 0;
  const std::uint32_t previous = phase_;
  phase_ = timeline_->intern(name);
  timeline_->phase_marks.push_back({seconds(), phase_, timeline_->events.size()});
  return previous;
}

void Arena::restore_phase(std::uint32_t id) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!timeline_ || id >= timeline_->phases.size()) return;
  phase_ = id;
  timeline_->phase_marks.push_back({seconds(), phase_, timeline_->events.size()});
}

void Arena::begin_step(std::int64_t step) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!timeline_) return;
  timeline_->steps.push_back({step, seconds(), -1, timeline_->events.size(), timeline_->events.size()});
}

void Arena::end_step() {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!timeline_ || timeline_->steps.empty()) return;
  MemoryStepMark& s = timeline_->steps.back();
  s.t_end = seconds();
  s.event_end = timeline_->events.size();
}

}  // namespace peakbound
