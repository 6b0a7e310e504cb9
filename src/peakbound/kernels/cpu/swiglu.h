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

}  // namespace peakbound::cpu
