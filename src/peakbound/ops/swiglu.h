// SwiGLU activation through the device's backend (see kernels/cpu/swiglu.h for the
// math): forward writes out; backward WRITES dgate and dup (not added), which may alias
// gate and up.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void swiglu_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n);
void swiglu_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n);

}  // namespace peakbound::ops
