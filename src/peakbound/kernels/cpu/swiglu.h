// The SwiGLU activation, llm.c style: out = silu(gate) * up, silu(g) = g / (1 + e^-g),
// elementwise over n values. The FFN around it (W_gate, W_up [F, H], W_down [H, F]) is
// GEMMs; this is the part between them, shared by the dense test block and the MoE
// experts. n is the element count (tokens x F for one FFN).
//
// bf16 forms: every tensor (gate, up, out, dout, dgate, dup) bf16; computed in fp32
// exactly as the f32 forms, rounded once at each store, so each output is bitwise
// to_bf16(the f32 form's output on the widened inputs). Aliasing as the f32 forms.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

// gate [n], up [n] -> out [n]. out may alias gate or up.
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n);

// dout [n], gate [n], up [n] -> dgate [n], dup [n], WRITTEN, not added: they are fresh
// intermediates with one consumer each, and adding would cost a zero-fill of 2n floats
// per call. dgate may alias gate and dup may alias up (each element is read before it
// is written), so a backward can reuse the forward's buffers.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n);

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::int64_t n);
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::int64_t n);

// gpt-oss's clamped form (transformers' GptOssExperts._apply_gate), with alpha
// (swiglu_alpha, 1.702) and limit (swiglu_limit, 7.0):
//   g = min(gate, limit), u = clamp(up, -limit, limit)
//   out = (u + 1) * (g * sigmoid(alpha * g))
// in that order of operations. Backward as torch's autograd takes it: a clamp passes the
// gradient strictly inside its bounds and stops it on and past them (torch 2.15 gives 0 at
// x == limit):
//   dgate = gate < limit ? dout (u + 1) s (1 + alpha g (1 - s)) : 0,  s = sigmoid(alpha g)
//   dup   = -limit < up < limit ? dout g s : 0
// Aliasing and the bf16 forms as above. (gpt-oss stores gate and up interleaved along the
// last axis; these take them apart, as the loader lays them out.)
struct ClampedSwiglu {
  float alpha = 1.702f, limit = 7.0f;
};
void swiglu_clamped_forward(float* out, const float* gate, const float* up, std::int64_t n, ClampedSwiglu c);
void swiglu_clamped_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                             std::int64_t n, ClampedSwiglu c);
void swiglu_clamped_forward(bf16* out, const bf16* gate, const bf16* up, std::int64_t n, ClampedSwiglu c);
void swiglu_clamped_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                             std::int64_t n, ClampedSwiglu c);

}  // namespace peakbound::cpu
