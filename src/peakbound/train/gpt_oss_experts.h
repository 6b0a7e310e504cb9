// gpt-oss's routed experts between its checkpoint layout and the trainer's.
//
// The checkpoint (transformers' GptOssExperts, unquantized or after MXFP4 dequantization)
// fuses each layer's experts and multiplies from the left (x @ W):
//   gate_up_proj       [E, H, 2F]  gate and up INTERLEAVED on the last axis: column 2f is
//                                  gate's f, column 2f + 1 up's f
//   gate_up_proj_bias  [E, 2F]     the same interleave
//   down_proj          [E, F, H]
//   down_proj_bias     [E, H]
// The trainer keeps each expert as one packed row in nn.Linear layout (out x in), as the
// other families' experts plus their biases (schedules/moe_shape.h):
//   [W_gate F,H | W_up F,H | W_down H,F | b_gate F | b_up F | b_down H]   (3FH + 2F + H)
// pack reads expert e's slices of the four checkpoint tensors (each given at its expert's
// first element) and writes the packed row; unpack is its exact inverse (export, and the
// gradients' comparison with transformers'). Both are plain copies: the bits move unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

inline std::int64_t gpt_oss_expert_floats(std::int64_t hidden, std::int64_t ffn) {
  return 3 * ffn * hidden + 2 * ffn + hidden;
}

// Where a piece of the trainer's expert row starts, from its table name
// ("model.layers.0.mlp.experts.3.up_proj.bias" -> F H + ... ): gate_proj.weight 0,
// up_proj.weight FH, down_proj.weight 2FH, gate_proj.bias 3FH, up_proj.bias 3FH + F,
// down_proj.bias 3FH + 2F.
inline std::int64_t gpt_oss_piece_offset(const std::string& name, std::int64_t H, std::int64_t F) {
  const std::size_t last = name.rfind('.');
  const std::size_t dot = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('.', last - 1);
  const std::string piece = dot == std::string::npos ? name : name.substr(dot + 1);
  if (piece == "gate_proj.weight") return 0;
  if (piece == "up_proj.weight") return F * H;
  if (piece == "down_proj.weight") return 2 * F * H;
  if (piece == "gate_proj.bias") return 3 * F * H;
  if (piece == "up_proj.bias") return 3 * F * H + F;
  if (piece == "down_proj.bias") return 3 * F * H + 2 * F;
  throw InternalError("'" + name + "' is not a piece of a gpt-oss expert row");
}

template <class T>
void gpt_oss_pack_expert(T* packed, const T* gate_up, const T* gate_up_bias, const T* down, const T* down_bias,
                         std::int64_t H, std::int64_t F) {
  T* w_gate = packed;
  T* w_up = packed + F * H;
  T* w_down = packed + 2 * F * H;
  T* b = packed + 3 * F * H;
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t f = 0; f < F; ++f) {
      w_gate[f * H + h] = gate_up[h * 2 * F + 2 * f];
      w_up[f * H + h] = gate_up[h * 2 * F + 2 * f + 1];
    }
  for (std::int64_t f = 0; f < F; ++f)
    for (std::int64_t h = 0; h < H; ++h) w_down[h * F + f] = down[f * H + h];
  for (std::int64_t f = 0; f < F; ++f) {
    b[f] = gate_up_bias[2 * f];
    b[F + f] = gate_up_bias[2 * f + 1];
  }
  for (std::int64_t h = 0; h < H; ++h) b[2 * F + h] = down_bias[h];
}

template <class T>
void gpt_oss_unpack_expert(const T* packed, T* gate_up, T* gate_up_bias, T* down, T* down_bias, std::int64_t H,
                           std::int64_t F) {
  const T* w_gate = packed;
  const T* w_up = packed + F * H;
  const T* w_down = packed + 2 * F * H;
  const T* b = packed + 3 * F * H;
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t f = 0; f < F; ++f) {
      gate_up[h * 2 * F + 2 * f] = w_gate[f * H + h];
      gate_up[h * 2 * F + 2 * f + 1] = w_up[f * H + h];
    }
  for (std::int64_t f = 0; f < F; ++f)
    for (std::int64_t h = 0; h < H; ++h) down[f * H + h] = w_down[h * F + f];
  for (std::int64_t f = 0; f < F; ++f) {
    gate_up_bias[2 * f] = b[f];
    gate_up_bias[2 * f + 1] = b[F + f];
  }
  for (std::int64_t h = 0; h < H; ++h) down_bias[h] = b[2 * F + h];
}

}  // namespace peakbound
