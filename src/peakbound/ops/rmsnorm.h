// RMSNorm over the last dimension through the device's backend (kernels/cpu/rmsnorm.h):
// forward writes out [N, C] and rstd [N]; backward ADDS into dx [N, C] and dweight [C].
// The bf16 forms: x, weight, out, dout, dx bf16; rstd and dweight fp32.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

void rmsnorm_forward(Device& dev, Stream& s, float* out, float* rstd, const float* x, const float* weight,
                     std::int64_t n, std::int64_t c, float eps);
void rmsnorm_backward(Device& dev, Stream& s, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c);
void rmsnorm_forward(Device& dev, Stream& s, bf16* out, float* rstd, const bf16* x, const bf16* weight,
                     std::int64_t n, std::int64_t c, float eps);
void rmsnorm_backward(Device& dev, Stream& s, bf16* dx, float* dweight, const bf16* dout, const bf16* x,
                      const bf16* weight, const float* rstd, std::int64_t n, std::int64_t c);

}  // namespace peakbound::ops
