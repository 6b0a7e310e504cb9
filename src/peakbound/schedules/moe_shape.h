// The shape of one routed-expert MoE layer: hidden size, expert FFN width, routed
// experts and experts per token. Each expert is a SwiGLU FFN [W_gate [F, H] | W_up
// [F, H] | W_down [H, F]] stored contiguously (expert_floats elements).
#pragma once

#include <cstdint>

namespace peakbound {

struct MoeShape {
  std::int64_t hidden = 0, ffn = 0, experts = 0, top_k = 0;
  std::int64_t expert_floats() const { return 3 * ffn * hidden; }
};

}  // namespace peakbound
