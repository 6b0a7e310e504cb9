// Rotary position embedding as Hugging Face transformers applies it to Llama, Qwen3,
// Qwen3-MoE and Mixtral (apply_rotary_pos_emb with rotate_half): the head dim D is
// split into halves x1 = x[..., :D/2], x2 = x[..., D/2:], and for i < D/2
//   out[i]       = x1[i] * cos[t, i] - x2[i] * sin[t, i]
//   out[i + D/2] = x2[i] * cos[t, i] + x1[i] * sin[t, i]
// i.e. out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), with
// angle[t, i] = (offset + t) * inv_freq[i], inv_freq[i] = theta^(-2i / D).
// transformers duplicates the angles to [T, D]; the table here keeps the D/2 unique
// columns. The backward is the rotation by -angle (the rotation is orthogonal).
//
// bf16 (mixed precision): x / dx may be bf16; the cos / sin tables stay fp32. Each pair
// is widened, rotated in fp32 exactly as the f32 form and rounded once where it is
// stored, so the bf16 result is bitwise to_bf16(the f32 result on the widened input).
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/model/rope_scaling.h"

namespace peakbound::cpu {

// Throws InvalidArgument naming the bad value: T >= 0, D even and > 0, heads >= 0,
// offset >= 0, theta finite and > 0.
void rope_check(std::int64_t t, std::int64_t d, std::int64_t offset, double theta);

// WRITES cos [T, D/2] and sin [T, D/2] for positions offset .. offset + T - 1. The
// inverse frequency, the angle, cos and sin are computed in double and rounded to
// float once at the end (transformers computes the angle in float32, whose rounding
// grows with the position: ~position * 2^-24 radians). With YaRN (model/rope_scaling.h)
// the inverse frequencies are YaRN's and cos and sin are multiplied by its
// attention_factor before the rounding.
void rope_tables(float* cos, float* sin, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta, const RopeScaling& scaling = {});

// x [T, heads, D] rotated IN PLACE by +angle (forward) or -angle (backward: x is the
// gradient of the forward's output and becomes the gradient of its input).
void rope_forward(float* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                  std::int64_t d);
void rope_backward(float* dx, const float* cos, const float* sin, std::int64_t t,
                   std::int64_t heads, std::int64_t d);
// The same on bf16 x [T, heads, D] / dx, rotated IN PLACE (fp32 tables).
void rope_forward(bf16* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                  std::int64_t d);
void rope_backward(bf16* dx, const float* cos, const float* sin, std::int64_t t,
                   std::int64_t heads, std::int64_t d);

}  // namespace peakbound::cpu
