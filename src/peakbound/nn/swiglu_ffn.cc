#include "peakbound/nn/swiglu_ffn.h"

#include "peakbound/core/error.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/swiglu.h"

namespace peakbound {

namespace {

void check_sizes(std::int64_t m, std::int64_t hidden, std::int64_t ffn) {
  PB_CHECK_MSG(m >= 0 && hidden > 0 && ffn > 0, "swiglu ffn: m must be >= 0, hidden and ffn > 0");
}

}  // namespace

SwigluFfnBuffers swiglu_ffn_buffers(std::int64_t m, std::int64_t ffn, std::uint64_t elem_bytes, Component c) {
  if (m < 0 || ffn < 1) throw InvalidArgument("swiglu ffn: rows must be >= 0 and ffn >= 1");
  const std::uint64_t count = checked_mul(static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(ffn), "swiglu ffn [m, F]");
  const BufferSpec one = buffer_spec(c, count, elem_bytes);
  return {one, one, one};
}

void swiglu_ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                        const SwigluFfnWeights& w, float* gate, float* up, float* act, float* out,
                        bool accumulate_out) {
  check_sizes(m, H, F);
  if (m == 0) return;
  ops::gemm(dev, s, false, true, m, F, H, 1.0f, x, H, w.gate, H, 0.0f, gate, F);  // gate = x W_gate^T
  ops::gemm(dev, s, false, true, m, F, H, 1.0f, x, H, w.up, H, 0.0f, up, F);      // up = x W_up^T
  ops::swiglu_forward(dev, s, act, gate, up, m * F);                               // act = silu(gate) up
  if (out == nullptr) return;
  ops::gemm(dev, s, false, true, m, H, F, 1.0f, act, F, w.down, F, accumulate_out ? 1.0f : 0.0f, out, H);
}

void swiglu_ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                         const SwigluFfnWeights& w, const float* dout, float* gate, float* up, float* act,
                         const SwigluFfnGrads& dw, float* dx, bool accumulate_dx) {
  check_sizes(m, H, F);
  if (m == 0) return;
  ops::gemm(dev, s, true, false, H, F, m, 1.0f, dout, H, act, F, 1.0f, dw.down, F);  // dW_down += dout^T act
  float* dact = act;                                                                  // act is no longer needed
  ops::gemm(dev, s, false, false, m, F, H, 1.0f, dout, H, w.down, F, 0.0f, dact, F);  // dact = dout W_down
  ops::swiglu_backward(dev, s, gate, up, dact, gate, up, m * F);                      // dgate, dup in place
  ops::gemm(dev, s, true, false, F, H, m, 1.0f, gate, F, x, H, 1.0f, dw.gate, H);     // dW_gate += dgate^T x
  ops::gemm(dev, s, true, false, F, H, m, 1.0f, up, F, x, H, 1.0f, dw.up, H);         // dW_up += dup^T x
  // x is read for the last time above, so dx may alias it.
  ops::gemm(dev, s, false, false, m, H, F, 1.0f, gate, F, w.gate, H, accumulate_dx ? 1.0f : 0.0f, dx, H);
  ops::gemm(dev, s, false, false, m, H, F, 1.0f, up, F, w.up, H, 1.0f, dx, H);        // dx (+)= dgate W_gate + dup W_up
}

}  // namespace peakbound
