// Helpers of the ring attention tests: a rank's zigzag rows of a whole-sequence tensor, and
// a device buffer holding a host vector.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "peakbound/device/device.h"
#include "peakbound/schedules/context_layout.h"

namespace peakbound::testing {

// Rows of a [S, w] tensor at this rank's shard positions, in shard order.
template <class T>
std::vector<T> shard_rows(const std::vector<T>& x, std::int64_t w, const CpShard& sh) {
  std::vector<T> y(static_cast<std::size_t>(sh.tokens() * w));
  for (std::int64_t t = 0; t < sh.tokens(); ++t) std::copy_n(x.begin() + sh.position(t) * w, w, y.begin() + t * w);
  return y;
}

// Device buffer holding v (the CPU device's memory is the host's), under component layer.
template <class T>
Buffer upload(Device& dev, const std::vector<T>& v) {
  Buffer b = dev.allocate(Component::layer, std::max<std::size_t>(v.size() * sizeof(T), 4));
  std::copy(v.begin(), v.end(), b.as<T>());
  return b;
}

}  // namespace peakbound::testing
