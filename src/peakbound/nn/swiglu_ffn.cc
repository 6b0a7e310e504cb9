#include "peakbound/nn/swiglu_ffn.h"

#include <algorithm>

#include "peakbound/core/error.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/swiglu.h"

namespace peakbound {

namespace {

void check_sizes(std::int64_t m, std::int64_t hidden, std::int64_t ffn) {
  PB_CHECK_MSG(m >= 0 && hidden > 0 && ffn > 0, "swiglu ffn: m must be >= 0, hidden and ffn > 0");
}

LinearMode mode_of(bool accumulate) { return accumulate ? LinearMode::add : LinearMode::write; }

// Written once for both precisions: with A = float every product is the ops::gemm call
// (order and beta) this file made before the bf16 form existed.
template <class A>
void forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const A* x,
             const SwigluFfnWeightsOf<A>& w, A* gate, A* up, A* act, A* out, bool accumulate_out, float* tile) {
  check_sizes(m, H, F);
  if (m == 0) return;
  const bool biased = w.b_gate != nullptr;
  PB_CHECK_MSG(biased == (w.b_up != nullptr) && biased == (w.b_down != nullptr),
               "swiglu ffn: the three biases go together");
  PB_CHECK_MSG(!(biased && accumulate_out), "swiglu ffn: a biased FFN writes its output");
  // A bias: every row of the output starts as it, then the product adds (one rounding).
  const auto bias = [&](A* y, const A* b, std::int64_t n) {
    if (b != nullptr) ops::broadcast_rows(dev, s, y, b, m, n);
  };
  const LinearMode into = biased ? LinearMode::add : LinearMode::write;
  bias(gate, w.b_gate, F);
  linear(dev, s, m, F, {{.a = x, .lda = H, .b = w.gate, .ldb = H, .k = H, .trans_b = true}}, gate, F, into,
         tile);  // gate = x W_gate^T (+ b_gate)
  bias(up, w.b_up, F);
  linear(dev, s, m, F, {{.a = x, .lda = H, .b = w.up, .ldb = H, .k = H, .trans_b = true}}, up, F, into,
         tile);  // up = x W_up^T (+ b_up)
  if (w.clamp != nullptr)
    ops::swiglu_clamped_forward(dev, s, act, gate, up, m * F, *w.clamp);  // act = (u + 1) g sigmoid(alpha g)
  else
    ops::swiglu_forward(dev, s, act, gate, up, m * F);  // act = silu(gate) up
  if (out == nullptr) return;
  bias(out, w.b_down, H);
  linear(dev, s, m, H, {{.a = act, .lda = F, .b = w.down, .ldb = F, .k = F, .trans_b = true}}, out, H,
         biased ? LinearMode::add : mode_of(accumulate_out), tile);  // out (+)= act W_down^T (+ b_down)
}

template <class A>
void backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const A* x,
              const SwigluFfnWeightsOf<A>& w, const A* dout, A* gate, A* up, A* act, const SwigluFfnGrads& dw, A* dx,
              bool accumulate_dx, float* tile) {
  check_sizes(m, H, F);
  if (m == 0) return;
  const bool biased = w.b_gate != nullptr;
  PB_CHECK_MSG(!biased || (dw.b_gate && dw.b_up && dw.b_down), "swiglu ffn: a biased FFN needs its bias gradients");
  add_weight_grad(dev, s, H, F, m, dout, act, dw.down);  // dW_down += dout^T act
  if (biased) ops::add_column_sums(dev, s, dw.b_down, dout, m, H);
  A* dact = act;                                         // act is no longer needed
  linear(dev, s, m, F, {{.a = dout, .lda = H, .b = w.down, .ldb = F, .k = H, .trans_b = false}}, dact, F,
         LinearMode::write, tile);  // dact = dout W_down
  if (w.clamp != nullptr)
    ops::swiglu_clamped_backward(dev, s, gate, up, dact, gate, up, m * F, *w.clamp);  // dgate, dup in place
  else
    ops::swiglu_backward(dev, s, gate, up, dact, gate, up, m * F);  // dgate, dup in place
  if (biased) {
    ops::add_column_sums(dev, s, dw.b_gate, gate, m, F);
    ops::add_column_sums(dev, s, dw.b_up, up, m, F);
  }
  add_weight_grad(dev, s, F, H, m, gate, x, dw.gate);             // dW_gate += dgate^T x
  add_weight_grad(dev, s, F, H, m, up, x, dw.up);                 // dW_up += dup^T x
  // x is read for the last time above, so dx may alias it. One sum: bf16 rounds it once.
  linear(dev, s, m, H,
         {{.a = gate, .lda = F, .b = w.gate, .ldb = H, .k = F, .trans_b = false},
          {.a = up, .lda = F, .b = w.up, .ldb = H, .k = F, .trans_b = false}},
         dx, H, mode_of(accumulate_dx), tile);  // dx (+)= dgate W_gate + dup W_up
}

}  // namespace

SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t H, std::int64_t F, Precision p, Component c) {
  if (m < 0 || H < 1 || F < 1) throw InvalidArgument("swiglu ffn: rows must be >= 0, hidden and ffn >= 1");
  SwigluFfnBuffers b = swiglu_ffn_buffers(m, F, dtype_size(activation_dtype(p)), c);
  b.tile = linear_tile_spec(m, std::max(H, F), p, c);
  return b;
}

SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t ffn, std::uint64_t elem_bytes, Component c) {
  if (m < 0 || ffn < 1) throw InvalidArgument("swiglu ffn: rows must be >= 0 and ffn >= 1");
  const std::uint64_t count =
      checked_mul(static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(ffn), "swiglu ffn [m, F]");
  const BufferSpec one = buffer_spec(c, count, elem_bytes);
  return {one, one, one, buffer_spec(c, 0, sizeof(float))};
}

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                        const SwigluFfnWeights& w, float* gate, float* up, float* act, float* out,
                        bool accumulate_out) {
  forward<float>(dev, s, m, H, F, x, w, gate, up, act, out, accumulate_out, nullptr);
}

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                         const SwigluFfnWeights& w, const float* dout, float* gate, float* up, float* act,
                         const SwigluFfnGrads& dw, float* dx, bool accumulate_dx) {
  backward<float>(dev, s, m, H, F, x, w, dout, gate, up, act, dw, dx, accumulate_dx, nullptr);
}

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const bf16* x,
                        const SwigluFfnWeightsBf16& w, bf16* gate, bf16* up, bf16* act, bf16* out, bool accumulate_out,
                        float* tile) {
  forward<bf16>(dev, s, m, H, F, x, w, gate, up, act, out, accumulate_out, tile);
}

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const bf16* x,
                         const SwigluFfnWeightsBf16& w, const bf16* dout, bf16* gate, bf16* up, bf16* act,
                         const SwigluFfnGrads& dw, bf16* dx, bool accumulate_dx, float* tile) {
  backward<bf16>(dev, s, m, H, F, x, w, dout, gate, up, act, dw, dx, accumulate_dx, tile);
}

}  // namespace peakbound
