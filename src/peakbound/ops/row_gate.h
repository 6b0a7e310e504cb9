// The per-row sigmoid gate (Qwen2-MoE's shared_expert_gate) through the device's
// backend; math and aliasing in kernels/cpu/row_gate.h. Forward writes or ADDS INTO
// out [m, n]; backward WRITES dx [m, n] and dz [m].
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void row_gate_forward(Device& dev, Stream& s, float* out, const float* x, const float* z, std::int64_t m,
                      std::int64_t n, bool accumulate);
void row_gate_backward(Device& dev, Stream& s, float* dx, float* dz, const float* dout, const float* x,
                       const float* z, std::int64_t m, std::int64_t n);

}  // namespace peakbound::ops
