#include "peakbound/device/cpu/cpu_device.h"

#include "peakbound/core/device_access.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

CpuDevice::CpuDevice(std::uint64_t memory_budget, std::string name)
    : name_(std::move(name)),
      compute_(name_ + "/compute", CpuStream::Mode::inline_on_caller),
      copy_(name_ + "/copy", CpuStream::Mode::worker_thread) {
  const std::uint64_t budget = memory_budget / Arena::kAlignment * Arena::kAlignment;
  // The region has the Arena's stagger reserve on top of the budget (see core/arena.h).
  const std::uint64_t reserve = budget > 0 ? Arena::kStaggerReserve : 0;
  region_bytes_ = budget + reserve;
  if (region_bytes_ > 0) {
    // NORESERVE: pages are committed when first touched, so a large budget costs only
    // address space until the Arena actually places data there.
    region_ = mmap(nullptr, region_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region_ == MAP_FAILED) {
      region_ = nullptr;
      throw OutOfBudget("cpu device: cannot reserve " +
                        format_bytes(static_cast<double>(region_bytes_)) +
                        " of address space for the device memory budget: " + std::strerror(errno));
    }
  }
  arena_ = std::make_unique<Arena>(name_, budget, region_, Location::device, reserve);
  strict_region_add(region_, region_bytes_);  // PEAKBOUND_STRICT_DEVICE=1: closed to host code
}

CpuDevice::~CpuDevice() {
  try {
    synchronize();
  } catch (...) {
    // Destruction must not throw; a failed copy was the caller's to collect.
  }
  extra_.clear();
  arena_.reset();
  strict_region_remove(region_);
  if (region_) munmap(region_, region_bytes_);
}

Stream& CpuDevice::create_stream(const std::string& name) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  extra_.push_back(std::make_unique<CpuStream>(name_ + "/" + name, CpuStream::Mode::worker_thread));
  return *extra_.back();
}

CpuStream& CpuDevice::own(Stream& s) {
  auto* cs = dynamic_cast<CpuStream*>(&s);
  if (!cs) throw InvalidArgument("cpu device: stream '" + s.name() + "' belongs to another device");
  return *cs;
}

void CpuDevice::memcpy_async(void* dst, const void* src, std::uint64_t bytes, CopyKind kind,
                             Stream& s) {
  if (bytes == 0) return;
  PB_CHECK_MSG(dst && src, "memcpy_async with a null pointer");
  own(s).submit([this, dst, src, bytes, kind] {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(stats_mu_);
    auto k = static_cast<std::size_t>(kind);
    stats_.bytes[k] += bytes;
    stats_.seconds[k] += secs;
    stats_.copies[k] += 1;
  });
}

void CpuDevice::host_task(Stream& s, std::function<void()> fn) { own(s).submit(std::move(fn)); }

Event CpuDevice::record(Stream& s) { return own(s).record(); }

void CpuDevice::wait(Stream& s, const Event& e) { own(s).wait(e); }

void CpuDevice::synchronize(Stream& s) { own(s).synchronize(); }

void CpuDevice::synchronize() {
  compute_.synchronize();
  copy_.synchronize();
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (auto& s : extra_) s->synchronize();
}

CopyStats CpuDevice::copy_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace peakbound
