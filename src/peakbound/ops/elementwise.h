// Elementwise f32 ops on device memory, through the device's backend.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void fill(Device& dev, Stream& s, float* x, std::int64_t n, float v);           // x = v
void scale(Device& dev, Stream& s, float* x, std::int64_t n, float a);          // x *= a
void axpy(Device& dev, Stream& s, float* y, const float* x, std::int64_t n, float a);  // y += a x
void add(Device& dev, Stream& s, float* out, const float* a, const float* b, std::int64_t n);  // out = a + b

}  // namespace peakbound::ops
