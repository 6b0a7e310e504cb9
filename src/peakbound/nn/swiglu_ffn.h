// The SwiGLU feed-forward network, forward and backward, written once for every layer
// that computes it (the residual MLP block, the MoE experts): llm.c-style free
// functions over raw row-major f32 device pointers, through ops:: on stream s.
//
//   out = act W_down^T,  act = silu(gate) * up,  gate = x W_gate^T,  up = x W_up^T
//
// Shapes (m rows, possibly 0; hidden H; intermediate F; nn.Linear layout, out x in):
//   x        [m, H]  input, read
//   w_gate   [F, H]  weights, read (three separate pointers: they need not be one buffer)
//   w_up     [F, H]
//   w_down   [H, F]
//   gate     [m, F]  forward writes x W_gate^T; backward overwrites it with dgate
//   up       [m, F]  forward writes x W_up^T;   backward overwrites it with dup
//   act      [m, F]  forward writes silu(gate) * up; backward overwrites it with dact
//   out      [m, H]  forward: written, or added into with accumulate_out; null: stop
//                    after act (what a backward's recompute needs)
//   dout     [m, H]  backward: the gradient of out, read
//   dw_gate  [F, H]  backward: ADDED into
//   dw_up    [F, H]  backward: ADDED into
//   dw_down  [H, F]  backward: ADDED into
//   dx       [m, H]  backward: written, or added into with accumulate_dx; may alias x
//                    (x is last read before dx is first written)
// Backward needs the forward's gate, up and act (kept, or recomputed from x by a
// second forward): it uses them as its own scratch, so it allocates nothing.
#pragma once

#include <cstdint>

#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"

namespace peakbound {

struct SwigluFfnWeights {
  const float* gate = nullptr;  // [F, H]
  const float* up = nullptr;    // [F, H]
  const float* down = nullptr;  // [H, F]
};

struct SwigluFfnGrads {
  float* gate = nullptr;  // [F, H], added into
  float* up = nullptr;    // [F, H], added into
  float* down = nullptr;  // [H, F], added into
};

// The three [m, F] intermediates, as one caller allocates them (component c).
struct SwigluFfnBuffers {
  BufferSpec gate, up, act;
  std::uint64_t reserved() const { return gate.reserved() + up.reserved() + act.reserved(); }
};
SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t ffn, std::uint64_t elem_bytes,
                                    Component c = Component::layer);

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn,
                        const float* x, const SwigluFfnWeights& w, float* gate, float* up, float* act, float* out,
                        bool accumulate_out);

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn,
                         const float* x, const SwigluFfnWeights& w, const float* dout, float* gate, float* up,
                         float* act, const SwigluFfnGrads& dw, float* dx, bool accumulate_dx);

}  // namespace peakbound
