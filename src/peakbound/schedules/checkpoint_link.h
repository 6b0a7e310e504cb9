// CheckpointLink: the copy engine as SCO uses it. Every boundary copy, D2H in forward
// and H2D in backward, goes on one stream in issue order, so a prefetch into a ring
// slot can never overtake the offload that last read that slot.
//
// Optional host-link emulation (off by default, always labelled in output): on the
// CPU device a copy is a memcpy at DRAM speed, far faster relative to compute than a
// GPU's PCIe/NVLink-C2C link. With `gbytes_per_second` > 0 each copy is made to take at
// least bytes / bandwidth on the copy engine (the memcpy, then a sleep for the rest),
// so overlap can be studied at GPU-like ratios of compute to copy speed. The timing
// runs as host tasks on the copy stream (Device::host_task), so it needs the CPU
// device, whose copy stream is its own thread; other devices have a real link.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "peakbound/device/device.h"

namespace peakbound {

class CheckpointLink {
 public:
  // gbytes_per_second: 0 = no emulation; otherwise emulates a link of 1e9 * that
  // bytes/s. Throws InvalidArgument for a bandwidth validate_link_gbps refuses (below
  // CheckpointOptions::kMinLinkGbps, negative, not finite), or emulation on a non-CPU stream.
  CheckpointLink(Device& dev, Stream& stream, double gbytes_per_second);

  // Enqueues dst <- src after all work already on the stream; the event completes
  // when the copy (and its emulated remainder) has.
  Event copy(void* dst, const void* src, std::uint64_t bytes, CopyKind kind);

  Stream& stream() const { return stream_; }
  bool emulated() const { return gbps_ > 0; }
  double gbytes_per_second() const { return gbps_; }
  // Seconds the copy engine spent sleeping to honour the emulated bandwidth, so far.
  double emulated_wait_seconds() const;

 private:
  struct Waits {
    std::mutex mu;
    double seconds = 0;
  };

  Device& dev_;
  Stream& stream_;
  double gbps_;
  std::shared_ptr<Waits> waits_ = std::make_shared<Waits>();
};

}  // namespace peakbound
