// SwiGLU activation through the device's backend (see kernels/cpu/swiglu.h for the
// math): forward writes out; backward WRITES dgate and dup (not added), which may alias
// gate and up. The bf16 forms take every tensor in bf16 (fp32 arithmetic, one rounding
// at each store).
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

void swiglu_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n);
void swiglu_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n);
void swiglu_forward(Device& dev, Stream& s, bf16* out, const bf16* gate, const bf16* up, std::int64_t n);
void swiglu_backward(Device& dev, Stream& s, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                     const bf16* up, std::int64_t n);

// gpt-oss's clamped form (kernels/cpu/swiglu.h: g = min(gate, limit), u = clamp(up, -limit,
// limit), out = (u + 1) g sigmoid(alpha g); the clamps stop the gradient on and past their
// bounds). CPU kernels only so far: Unavailable on CUDA.
struct SwigluClamp {
  float alpha = 1.702f;  // swiglu_alpha
  float limit = 7.0f;    // swiglu_limit
};
void swiglu_clamped_forward(Device& dev, Stream& s, float* out, const float* gate, const float* up, std::int64_t n,
                            SwigluClamp c);
void swiglu_clamped_backward(Device& dev, Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                             const float* up, std::int64_t n, SwigluClamp c);
void swiglu_clamped_forward(Device& dev, Stream& s, bf16* out, const bf16* gate, const bf16* up, std::int64_t n,
                            SwigluClamp c);
void swiglu_clamped_backward(Device& dev, Stream& s, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                             const bf16* up, std::int64_t n, SwigluClamp c);

}  // namespace peakbound::ops
