// dtype conversions on HOST memory, run by the host CPU whichever device the run
// uses (e.g. the optimizer's load writes bf16 parameters from fp32 master weights in
// host staging before copying them to the device). Round to nearest even, as the
// device kernels.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::ops {

// out[i] = bf16(in[i]) for i in [0, n), both host memory.
void host_to_bf16(bf16* out, const float* in, std::int64_t n);
// out[i] = float(in[i]) for i in [0, n), both host memory.
void host_to_f32(float* out, const bf16* in, std::int64_t n);

}  // namespace peakbound::ops
