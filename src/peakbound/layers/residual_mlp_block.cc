#include "peakbound/layers/residual_mlp_block.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/rmsnorm.h"
#include "peakbound/kernels/cpu/swiglu.h"

namespace peakbound {

namespace {

std::uint64_t f32_bytes(std::int64_t n) { return static_cast<std::uint64_t>(n) * sizeof(float); }

}  // namespace

ResidualMlpBlock::ResidualMlpBlock(Device& dev, std::int64_t hidden, std::int64_t ffn,
                                   std::uint64_t seed, float eps)
    : dev_(dev), hidden_(hidden), ffn_(ffn), eps_(eps) {
  if (hidden <= 0 || ffn <= 0)
    throw InvalidArgument("residual MLP block: hidden and ffn sizes must be positive (got " +
                          std::to_string(hidden) + " and " + std::to_string(ffn) + ")");
  const std::int64_t H = hidden_, F = ffn_;
  off_gate_ = H;
  off_up_ = off_gate_ + F * H;
  off_down_ = off_up_ + F * H;
  params_ = dev_.allocate(Component::params, f32_bytes(num_parameters()));
  grads_ = dev_.allocate(Component::grads, f32_bytes(num_parameters()));

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t i = 0; i < H; ++i) param(0)[i] = 1.0f + 0.1f * unit(rng);
  const float in_h = 1.0f / std::sqrt(static_cast<float>(H));
  const float in_f = 1.0f / std::sqrt(static_cast<float>(F));
  for (std::int64_t i = 0; i < 2 * F * H; ++i) param(off_gate_)[i] = in_h * unit(rng);
  for (std::int64_t i = 0; i < H * F; ++i) param(off_down_)[i] = in_f * unit(rng);
  zero_grad();
}

std::int64_t ResidualMlpBlock::check_shape(const Tensor& t, const char* what) const {
  PB_CHECK_MSG(t.dtype() == DType::f32 && t.ndim() == 2 && t.dim(1) == hidden_,
               std::string("residual MLP block: ") + what + " is " + t.shape().str() + ", want [T, " +
                   std::to_string(hidden_) + "] f32");
  return t.dim(0);
}

ResidualMlpBlock::Internals ResidualMlpBlock::recompute(const float* x, std::int64_t T) {
  const std::int64_t H = hidden_, F = ffn_;
  Internals in;
  in.n = dev_.allocate(Component::layer, f32_bytes(T * H));
  in.rstd = dev_.allocate(Component::layer, f32_bytes(T));
  in.gate = dev_.allocate(Component::layer, f32_bytes(T * F));
  in.up = dev_.allocate(Component::layer, f32_bytes(T * F));
  in.act = dev_.allocate(Component::layer, f32_bytes(T * F));
  float* n = in.n.as<float>();
  cpu::rmsnorm_forward(n, in.rstd.as<float>(), x, param(0), T, H, eps_);
  // gate = n W_gate^T, up = n W_up^T: [T, F]
  cpu::gemm_f32(false, true, T, F, H, 1.0f, n, H, param(off_gate_), H, 0.0f, in.gate.as<float>(), F);
  cpu::gemm_f32(false, true, T, F, H, 1.0f, n, H, param(off_up_), H, 0.0f, in.up.as<float>(), F);
  cpu::swiglu_forward(in.act.as<float>(), in.gate.as<float>(), in.up.as<float>(), T * F);
  return in;
}

void ResidualMlpBlock::forward(const Tensor& x, const Tensor& y) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(y, "y") == T && y.raw() != x.raw(), "residual MLP block: y must be a distinct [T, H]");
  if (T == 0) return;
  const std::int64_t H = hidden_, F = ffn_;
  Internals in = recompute(x.data<float>(), T);
  // y = x + act W_down^T
  std::memcpy(y.raw(), x.raw(), f32_bytes(T * H));
  cpu::gemm_f32(false, true, T, H, F, 1.0f, in.act.as<float>(), F, param(off_down_), F, 1.0f,
                y.data<float>(), H);
}

void ResidualMlpBlock::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(dy, "dy") == T && check_shape(dx, "dx") == T, "residual MLP block: token counts differ");
  PB_CHECK_MSG(dx.raw() != x.raw() && dx.raw() != dy.raw(), "residual MLP block: dx must not alias x or dy");
  if (T == 0) return;
  const std::int64_t H = hidden_, F = ffn_;
  const float* xp = x.data<float>();
  const float* g = dy.data<float>();
  Internals in = recompute(xp, T);
  float* act = in.act.as<float>();
  float* gate = in.gate.as<float>();
  float* up = in.up.as<float>();
  float* n = in.n.as<float>();

  // dW_down += dy^T act: [H, F]
  cpu::gemm_f32(true, false, H, F, T, 1.0f, g, H, act, F, 1.0f, grad(off_down_), F);
  // dact = dy W_down: [T, F], into act's buffer (act is no longer needed)
  float* dact = act;
  cpu::gemm_f32(false, false, T, F, H, 1.0f, g, H, param(off_down_), F, 0.0f, dact, F);
  // dgate, dup in place of gate, up
  cpu::swiglu_backward(gate, up, dact, gate, up, T * F);
  // dW_gate += dgate^T n, dW_up += dup^T n: [F, H]
  cpu::gemm_f32(true, false, F, H, T, 1.0f, gate, F, n, H, 1.0f, grad(off_gate_), H);
  cpu::gemm_f32(true, false, F, H, T, 1.0f, up, F, n, H, 1.0f, grad(off_up_), H);
  // dn = dgate W_gate + dup W_up: [T, H], into n's buffer (n is no longer needed)
  float* dn = n;
  cpu::gemm_f32(false, false, T, H, F, 1.0f, gate, F, param(off_gate_), H, 0.0f, dn, H);
  cpu::gemm_f32(false, false, T, H, F, 1.0f, up, F, param(off_up_), H, 1.0f, dn, H);
  // dx = dy (the residual path) + rmsnorm's backward, which adds.
  std::memcpy(dx.raw(), dy.raw(), f32_bytes(T * H));
  cpu::rmsnorm_backward(dx.data<float>(), grad(0), dn, xp, param(0), in.rstd.as<float>(), T, H);
}

std::vector<Parameter> ResidualMlpBlock::parameters() const {
  const std::int64_t H = hidden_, F = ffn_;
  auto make = [&](const char* name, std::int64_t off, Shape s) {
    return Parameter{name, Tensor(param(off), s, DType::f32, Location::device),
                     Tensor(grad(off), s, DType::f32, Location::device)};
  };
  return {make("norm.weight", 0, Shape{H}), make("gate.weight", off_gate_, Shape{F, H}),
          make("up.weight", off_up_, Shape{F, H}), make("down.weight", off_down_, Shape{H, F})};
}

void ResidualMlpBlock::zero_grad() { std::memset(grads_.data(), 0, f32_bytes(num_parameters())); }

}  // namespace peakbound
