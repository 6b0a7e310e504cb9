// ResidualMlpBlock: the block the checkpoint schedules are tested and benchmarked
// with until the MoE transformer block lands. A pre-norm residual SwiGLU MLP of
// realistic shape, f32 on the CPU device:
//   y = x + W_down (silu(W_gate n) * (W_up n)),  n = rmsnorm(x) * w_norm
// x, y [T, H]; w_norm [H]; W_gate, W_up [F, H]; W_down [H, F] (nn.Linear layout: out x in).
// Backward recomputes n, the gate/up projections and the activation from x.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/buffer.h"
#include "peakbound/device/device.h"
#include "peakbound/layers/block.h"

namespace peakbound {

class ResidualMlpBlock final : public Block {
 public:
  // Parameters (component params) and gradients (grads, zeroed) are allocated on dev;
  // values are drawn from `seed`: w_norm ~ 1 + N(0, 0.1), W ~ N(0, 1/sqrt(fan_in)).
  // Throws InvalidArgument for non-positive sizes.
  ResidualMlpBlock(Device& dev, std::int64_t hidden, std::int64_t ffn, std::uint64_t seed,
                   float eps = 1e-5f);

  void forward(const Tensor& x, const Tensor& y) override;
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

  Device& dev_;
  std::int64_t hidden_, ffn_;
  float eps_;
  // One buffer each, laid out [w_norm | W_gate | W_up | W_down].
  Buffer params_, grads_;
  std::int64_t off_gate_, off_up_, off_down_;
};

}  // namespace peakbound
