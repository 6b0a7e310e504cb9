// The SwiGLU feed-forward network, forward and backward, written once for every layer
// that computes it (the residual MLP block, the MoE experts): llm.c-style free
// functions over raw row-major device pointers, through ops:: on stream s, in f32 or
// bf16 (docs/precision.md).
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
//   dw_gate  [F, H]  backward: ADDED into (f32 in both precisions)
//   dw_up    [F, H]  backward: ADDED into
//   dw_down  [H, F]  backward: ADDED into
//   dx       [m, H]  backward: written, or added into with accumulate_dx; may alias x
//                    (x is last read before dx is first written)
// Backward needs the forward's gate, up and act (kept, or recomputed from x by a
// second forward): it uses them (and, in bf16, the caller's tile) as its own scratch, so
// it allocates nothing.
//
// The bf16 forms take x, the weights, gate, up, act, out, dout and dx in bf16 and the
// weight gradients in f32 (ops::gemm_bf16 adds into them). Every activation product goes
// through nn/linear.h, so each stored activation rounds once (dx = dgate W_gate + dup
// W_up included); they need `tile`, the fp32 scratch of SwigluFfnBuffers::tile. The f32
// forms make exactly the ops::gemm calls they always made.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/swiglu.h"

namespace peakbound {

// gpt-oss's experts (null / absent elsewhere): biases on the three projections
// (gate = x W_gate^T + b_gate, up = x W_up^T + b_up, out = act W_down^T + b_down; a bias
// is every row of the output before the product adds, one bf16 rounding) and the clamped
// activation (ops::SwigluClamp) in place of silu(gate) up. The bias gradients are ADDED
// into (f32): column sums of dgate, dup and dout over the m rows.
template <class T>
struct SwigluFfnWeightsOf {
  const T* gate = nullptr;  // [F, H]
  const T* up = nullptr;    // [F, H]
  const T* down = nullptr;  // [H, F]
  const T* b_gate = nullptr;  // [F] (all three biases or none)
  const T* b_up = nullptr;    // [F]
  const T* b_down = nullptr;  // [H]
  const ops::SwigluClamp* clamp = nullptr;  // null: silu(gate) * up
};
using SwigluFfnWeights = SwigluFfnWeightsOf<float>;
using SwigluFfnWeightsBf16 = SwigluFfnWeightsOf<bf16>;

struct SwigluFfnGrads {
  float* gate = nullptr;  // [F, H], added into
  float* up = nullptr;    // [F, H], added into
  float* down = nullptr;  // [H, F], added into
  float* b_gate = nullptr;  // [F], added into (with the weights' biases)
  float* b_up = nullptr;    // [F]
  float* b_down = nullptr;  // [H]
};

// The three [m, F] intermediates and the fp32 linear tile, as one caller allocates them
// (component c).
struct SwigluFfnBuffers {
  BufferSpec gate, up, act;
  BufferSpec tile{};  // linear_tile_spec(m, max(H, F)): 0 bytes under f32
  std::uint64_t reserved() const { return gate.reserved() + up.reserved() + act.reserved() + tile.reserved(); }
};
// Under precision p: gate, up and act in activation_dtype(p), and the tile.
SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t hidden, std::int64_t ffn, Precision p,
                                    Component c = Component::layer);
// The intermediates in elements of elem_bytes and no tile: the f32 layers' form, until
// they take a Precision.
SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t ffn, std::uint64_t elem_bytes,
                                    Component c = Component::layer);

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn,
                        const float* x, const SwigluFfnWeights& w, float* gate, float* up, float* act, float* out,
                        bool accumulate_out);

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn,
                         const float* x, const SwigluFfnWeights& w, const float* dout, float* gate, float* up,
                         float* act, const SwigluFfnGrads& dw, float* dx, bool accumulate_dx);

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn, const bf16* x,
                        const SwigluFfnWeightsBf16& w, bf16* gate, bf16* up, bf16* act, bf16* out, bool accumulate_out,
                        float* tile);

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t hidden, std::int64_t ffn, const bf16* x,
                         const SwigluFfnWeightsBf16& w, const bf16* dout, bf16* gate, bf16* up, bf16* act,
                         const SwigluFfnGrads& dw, bf16* dx, bool accumulate_dx, float* tile);

}  // namespace peakbound
