#include "peakbound/core/host_memory.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

HostMemory::HostMemory(std::uint64_t budget, std::string name, HostPages* pages)
    : ledger_(std::move(name), budget), pages_(pages) {}

Buffer HostMemory::allocate(Component c, std::uint64_t bytes) {
  if (bytes == 0) return Buffer();
  std::uint64_t size = (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ledger_.reserve(c, size);
  }
  void* p = pages_ ? pages_->allocate(size) : std::aligned_alloc(Arena::kAlignment, size);
  if (!p) {
    std::lock_guard<std::mutex> lock(mu_);
    ledger_.release(c, size);
    throw OutOfBudget(ledger_.refusal(c, size, "the operating system refused the allocation"));
  }
  Allocation a;
  a.ptr = p;
  a.bytes = size;
  a.component = c;
  return Buffer(this, a);
}

void HostMemory::release(const Allocation& a) noexcept {
  if (pages_)
    pages_->release(a.ptr);
  else
    std::free(a.ptr);
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.release(a.component, a.bytes);
}

std::uint64_t HostMemory::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.live();
}

std::uint64_t HostMemory::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak();
}

std::uint64_t HostMemory::peak(Component c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.peak(c);
}

void HostMemory::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.reset_peaks();
}

MemoryLedger HostMemory::ledger() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_;
}

nlohmann::json HostMemory::report_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.to_json();
}

std::string HostMemory::report_table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return "host memory " + ledger_.name() + ": budget " +
         (ledger_.unlimited() ? std::string("unlimited")
                              : format_bytes(static_cast<double>(ledger_.budget()))) +
         ", peak " + format_bytes(static_cast<double>(ledger_.peak())) + "\n" + ledger_.table();
}

}  // namespace peakbound
