// The shape of one routed-expert MoE layer: hidden size, expert FFN width, routed
// experts and experts per token. Each expert is a SwiGLU FFN [W_gate [F, H] | W_up
// [F, H] | W_down [H, F]] stored contiguously (expert_floats elements); gpt-oss's experts
// (bias) follow with [b_gate [F] | b_up [F] | b_down [H]] and use the clamped activation
// (clamp; nn/swiglu_ffn.h).
#pragma once

#include <cstdint>

#include "peakbound/ops/swiglu.h"

namespace peakbound {

struct MoeShape {
  std::int64_t hidden = 0, ffn = 0, experts = 0, top_k = 0;
  bool bias = false;     // gpt-oss: the three projections' biases after the weights
  bool clamped = false;  // gpt-oss: ops::SwigluClamp activation
  ops::SwigluClamp clamp{};
  std::int64_t expert_floats() const { return 3 * ffn * hidden + (bias ? 2 * ffn + hidden : 0); }
};

}  // namespace peakbound
