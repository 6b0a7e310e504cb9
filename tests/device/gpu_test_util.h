// Helpers of the gpu tests: skip without a GPU (with the runtime's reason), and move a
// host vector into a device buffer and back on the device's copy stream, ordered
// against the compute stream by events.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "peakbound/device/cuda/cuda_device.h"

#define PB_NEED_GPU()                                                    \
  do {                                                                   \
    std::string why_no_gpu;                                              \
    if (::peakbound::cuda_device_count(&why_no_gpu) == 0)                \
      GTEST_SKIP() << "no GPU: " << why_no_gpu;                          \
  } while (0)

namespace peakbound::testing {

constexpr std::uint64_t kMiB = 1024 * 1024;

// A device copy of v (at least 4 bytes, so an empty vector still has an address).
inline Buffer upload(Device& dev, const std::vector<float>& v) {
  Buffer b = dev.allocate(Component::workspace, v.size() * sizeof(float) + sizeof(float));
  dev.memcpy_async(b.data(), v.data(), v.size() * sizeof(float), CopyKind::host_to_device, dev.copy_stream());
  dev.wait(dev.compute_stream(), dev.record(dev.copy_stream()));
  return b;
}

// n floats of b, after the work on the compute stream so far.
inline std::vector<float> download(Device& dev, const Buffer& b, std::size_t n) {
  std::vector<float> out(n);
  dev.wait(dev.copy_stream(), dev.record(dev.compute_stream()));
  dev.memcpy_async(out.data(), b.data(), n * sizeof(float), CopyKind::device_to_host, dev.copy_stream());
  dev.synchronize(dev.copy_stream());
  return out;
}

inline float* f(Buffer& b) { return static_cast<float*>(b.data()); }

}  // namespace peakbound::testing
