// Helpers of the gpu tests: skip without a GPU (with the runtime's reason), and move a
// host vector into a device buffer and back on the device's copy stream, ordered
// against the compute stream by events; run the same ops on the CPU and CUDA devices
// from the same inputs and compare every buffer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/device/cuda/cuda_device.h"

#define PB_NEED_GPU()                                                    \
  do {                                                                   \
    std::string why_no_gpu;                                              \
    if (::peakbound::cuda_device_count(&why_no_gpu) == 0)                \
      GTEST_SKIP() << "no GPU: " << why_no_gpu;                          \
  } while (0)

namespace peakbound::testing {

constexpr std::uint64_t kMiB = 1024 * 1024;

// A device copy of v (4 bytes more, so an empty vector still has an address).
template <typename T>
inline Buffer upload(Device& dev, const std::vector<T>& v) {
  Buffer b = dev.allocate(Component::workspace, v.size() * sizeof(T) + sizeof(float));
  dev.memcpy_async(b.data(), v.data(), v.size() * sizeof(T), CopyKind::host_to_device, dev.copy_stream());
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

inline std::vector<float> randn(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * nd(rng);
  return v;
}

// Every element within rel of the CPU's; where the CPU's is a NaN (a NaN output, or an
// integer buffer such as targets, whose bits compare as floats: -100 is a NaN's pattern),
// the same bits.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      std::uint32_t g = 0, w = 0;
      std::memcpy(&g, &got[i], sizeof g);
      std::memcpy(&w, &want[i], sizeof w);
      ASSERT_EQ(g, w) << what << " element " << i << " (bits of a NaN or an integer)";
      continue;
    }
    ASSERT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << what << " element " << i;
  }
}

// Runs body on both devices with the same inputs; compares every buffer afterwards
// except those listed in `scratch` (a workspace each backend uses its own way).
inline void same_on_both(const std::vector<std::vector<float>>& inputs,
                         const std::function<void(Device&, std::vector<Buffer>&)>& body, float rel,
                         const std::string& what, const std::vector<std::size_t>& scratch = {}) {
  CudaDevice gpu(256 * kMiB);
  CpuDevice cpu(256 * kMiB);
  std::vector<std::vector<float>> outs[2];
  Device* devs[2] = {&cpu, &gpu};
  for (int d = 0; d < 2; ++d) {
    std::vector<Buffer> bufs;
    for (const auto& v : inputs) bufs.push_back(upload(*devs[d], v));
    body(*devs[d], bufs);
    for (std::size_t i = 0; i < inputs.size(); ++i) outs[d].push_back(download(*devs[d], bufs[i], inputs[i].size()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (std::find(scratch.begin(), scratch.end(), i) == scratch.end())
      expect_close(outs[1][i], outs[0][i], rel, what + " buffer " + std::to_string(i));
}

}  // namespace peakbound::testing
