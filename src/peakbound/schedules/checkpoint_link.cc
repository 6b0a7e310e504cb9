#include "peakbound/schedules/checkpoint_link.h"

#include <chrono>
#include <string>
#include <thread>

#include "peakbound/core/error.h"
#include "peakbound/schedules/checkpoint_policy.h"

namespace peakbound {

CheckpointLink::CheckpointLink(Device& dev, Stream& stream, double gbytes_per_second)
    : dev_(dev), stream_(stream), gbps_(gbytes_per_second) {
  validate_link_gbps(gbps_);
  // A real accelerator has a real link; emulation slows the CPU device's memcpy only.
  if (gbps_ > 0 && dev_.backend() != Backend::cpu)
    throw InvalidArgument("checkpoint link_gbps emulates a host link on the cpu device's copy engine only; "
                          "set it to 0 on device '" + dev_.name() + "'");
}

Event CheckpointLink::copy(void* dst, const void* src, std::uint64_t bytes, CopyKind kind) {
  if (gbps_ == 0) {
    dev_.memcpy_async(dst, src, bytes, kind, stream_);
    return dev_.record(stream_);
  }
  // Stamp the start on the engine itself (it may be busy with earlier copies), then
  // the memcpy, then sleep until start + bytes / bandwidth.
  using clock = std::chrono::steady_clock;
  auto start = std::make_shared<clock::time_point>();
  dev_.host_task(stream_, [start] { *start = clock::now(); });
  dev_.memcpy_async(dst, src, bytes, kind, stream_);
  const auto link_time = std::chrono::duration_cast<clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / (gbps_ * 1e9)));
  dev_.host_task(stream_, [start, link_time, waits = waits_] {
    const auto until = *start + link_time;
    const auto now = clock::now();
    if (now >= until) return;
    std::this_thread::sleep_until(until);
    std::lock_guard<std::mutex> lock(waits->mu);
    waits->seconds += std::chrono::duration<double>(clock::now() - now).count();
  });
  return dev_.record(stream_);
}

double CheckpointLink::emulated_wait_seconds() const {
  std::lock_guard<std::mutex> lock(waits_->mu);
  return waits_->seconds;
}

}  // namespace peakbound
