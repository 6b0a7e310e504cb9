// ResidualMlpBlock: the block the checkpoint schedules are tested and benchmarked
// with until the MoE transformer block lands. A pre-norm residual SwiGLU MLP of
// realistic shape, f32, computed through ops:: on the device's compute stream:
//   y = x + W_down (silu(W_gate n) * (W_up n)),  n = rmsnorm(x) * w_norm
// x, y [T, H]; w_norm [H]; W_gate, W_up [F, H]; W_down [H, F] (nn.Linear layout: out x in).
// The FFN is nn/swiglu_ffn.h. Backward recomputes n, the gate/up projections and
// the activation from x. Every buffer comes from the footprint functions below.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/buffer.h"
#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"
#include "peakbound/nn/block.h"
#include "peakbound/nn/swiglu_ffn.h"

namespace peakbound {

// Parameters and their gradients, one buffer each laid out [w_norm | W_gate | W_up | W_down]:
// H + 3 H F elements (components params, grads), allocated at construction.
struct ResidualMlpParamBuffers {
  BufferSpec params, grads;
};
ResidualMlpParamBuffers residual_mlp_param_buffers(std::int64_t hidden, std::int64_t ffn, std::uint64_t elem_bytes);

// One call's internals (component layer), allocated inside forward and backward and
// freed on return: n [T, H], rstd [T], gate, up, act [T, F]. Backward reuses them in
// place for dn, dgate, dup and dact, so it holds the same set.
struct ResidualMlpInternals {
  BufferSpec n, rstd;
  SwigluFfnBuffers ffn;
};
ResidualMlpInternals residual_mlp_internals(std::int64_t tokens, std::int64_t hidden, std::int64_t ffn,
                                            std::uint64_t elem_bytes);

// One block during one call on T tokens. Phases "forward" and "backward": device
// params and grads, and layer = n + rstd + gate + up + act (the same in both).
Footprint residual_mlp_footprint(std::int64_t tokens, std::int64_t hidden, std::int64_t ffn,
                                 std::uint64_t elem_bytes);

class ResidualMlpBlock final : public Block {
 public:
  // Parameters (component params) and gradients (grads, zeroed) are allocated on dev;
  // values are drawn from `seed`: w_norm ~ 1 + N(0, 0.1), W ~ N(0, 1/sqrt(fan_in)).
  // Throws InvalidArgument for non-positive sizes.
  ResidualMlpBlock(Device& dev, std::int64_t hidden, std::int64_t ffn, std::uint64_t seed,
                   float eps = 1e-5f);

  // y may be x (in place).
  void forward(const Tensor& x, const Tensor& y) override;
  bool forward_in_place() const override { return true; }
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  std::vector<Parameter> parameters() const override;
  void zero_grad() override;

  std::int64_t hidden() const { return hidden_; }
  std::int64_t ffn() const { return ffn_; }
  float eps() const { return eps_; }
  // Parameter count: H + 3 H F.
  std::int64_t num_parameters() const { return hidden_ + 3 * hidden_ * ffn_; }

 private:
  // The forward's internals, recomputed in backward; allocated per call under `layer`.
  struct Internals {
    Buffer n, rstd, gate, up, act;
  };
  Internals recompute(const float* x, std::int64_t tokens);
  std::int64_t check_shape(const Tensor& t, const char* what) const;
  float* param(std::int64_t offset) const { return params_.as<float>() + offset; }
  float* grad(std::int64_t offset) const { return grads_.as<float>() + offset; }
  SwigluFfnWeights ffn_weights() const { return {param(off_gate_), param(off_up_), param(off_down_)}; }
  SwigluFfnGrads ffn_grads() const { return {grad(off_gate_), grad(off_up_), grad(off_down_)}; }

  Device& dev_;
  std::int64_t hidden_, ffn_;
  float eps_;
  Buffer params_, grads_;
  std::int64_t off_gate_, off_up_, off_down_;
};

}  // namespace peakbound
