#include "peakbound/layers/residual_mlp_block.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"

namespace peakbound {

namespace {

// The runtime is f32; the footprint functions take the element size as a parameter.
const std::uint64_t kF32 = dtype_size(DType::f32);

void check_sizes(std::int64_t hidden, std::int64_t ffn) {
  if (hidden <= 0 || ffn <= 0)
    throw InvalidArgument("residual MLP block: hidden and ffn sizes must be positive (got " + std::to_string(hidden) +
                          " and " + std::to_string(ffn) + ")");
}

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

}  // namespace

ResidualMlpParamBuffers residual_mlp_param_buffers(std::int64_t H, std::int64_t F, std::uint64_t elem_bytes) {
  check_sizes(H, F);
  const auto h = static_cast<std::uint64_t>(H), f = static_cast<std::uint64_t>(F);
  const std::uint64_t count = checked_add(h, checked_mul(3 * h, f, "residual MLP parameters"), "residual MLP parameters");
  return {buffer_spec(Component::params, count, elem_bytes), buffer_spec(Component::grads, count, elem_bytes)};
}

ResidualMlpInternals residual_mlp_internals(std::int64_t T, std::int64_t H, std::int64_t F, std::uint64_t elem_bytes) {
  check_sizes(H, F);
  if (T < 0) throw InvalidArgument("residual MLP block: tokens must be >= 0 (got " + std::to_string(T) + ")");
  const auto t = static_cast<std::uint64_t>(T), h = static_cast<std::uint64_t>(H);
  ResidualMlpInternals in;
  in.n = buffer_spec(Component::layer, checked_mul(t, h, "residual MLP [T, H]"), elem_bytes);
  in.rstd = buffer_spec(Component::layer, t, elem_bytes);
  in.ffn = swiglu_ffn_buffers(T, F, elem_bytes, Component::layer);
  return in;
}

Footprint residual_mlp_footprint(std::int64_t T, std::int64_t H, std::int64_t F, std::uint64_t elem_bytes) {
  const ResidualMlpParamBuffers p = residual_mlp_param_buffers(H, F, elem_bytes);
  const ResidualMlpInternals in = residual_mlp_internals(T, H, F, elem_bytes);
  Footprint f("residual MLP block");
  for (const char* phase : {"forward", "backward"}) {
    f.device(phase, p.params).device(phase, p.grads);
    // A call with T = 0 returns before allocating (and the specs are 0 bytes then).
    f.device(phase, in.n).device(phase, in.rstd);
    f.device(phase, in.ffn.gate).device(phase, in.ffn.up).device(phase, in.ffn.act);
  }
  return f;
}

ResidualMlpBlock::ResidualMlpBlock(Device& dev, std::int64_t hidden, std::int64_t ffn,
                                   std::uint64_t seed, float eps)
    : dev_(dev), hidden_(hidden), ffn_(ffn), eps_(eps) {
  const ResidualMlpParamBuffers b = residual_mlp_param_buffers(hidden, ffn, kF32);
  const std::int64_t H = hidden_, F = ffn_;
  off_gate_ = H;
  off_up_ = off_gate_ + F * H;
  off_down_ = off_up_ + F * H;
  params_ = allocate(dev_, b.params);
  grads_ = allocate(dev_, b.grads);

  // Drawn on the host, then copied to the device in one piece.
  std::vector<float> init(static_cast<std::size_t>(off_down_ + H * F));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t i = 0; i < H; ++i) init[static_cast<std::size_t>(i)] = 1.0f + 0.1f * unit(rng);
  const float in_h = 1.0f / std::sqrt(static_cast<float>(H));
  const float in_f = 1.0f / std::sqrt(static_cast<float>(F));
  for (std::int64_t i = 0; i < 2 * F * H; ++i) init[static_cast<std::size_t>(off_gate_ + i)] = in_h * unit(rng);
  for (std::int64_t i = 0; i < H * F; ++i) init[static_cast<std::size_t>(off_down_ + i)] = in_f * unit(rng);
  copy_to_device(dev_, param(0), init.data(), init.size() * sizeof(float));
  zero_grad();
}

std::int64_t ResidualMlpBlock::check_shape(const Tensor& t, const char* what) const {
  PB_CHECK_MSG(t.dtype() == DType::f32 && t.ndim() == 2 && t.dim(1) == hidden_,
               std::string("residual MLP block: ") + what + " is " + t.shape().str() + ", want [T, " +
                   std::to_string(hidden_) + "] f32");
  return t.dim(0);
}

ResidualMlpBlock::Internals ResidualMlpBlock::recompute(const float* x, std::int64_t T) {
  const ResidualMlpInternals spec = residual_mlp_internals(T, hidden_, ffn_, kF32);
  Internals in;
  in.n = allocate(dev_, spec.n);
  in.rstd = allocate(dev_, spec.rstd);
  in.gate = allocate(dev_, spec.ffn.gate);
  in.up = allocate(dev_, spec.ffn.up);
  in.act = allocate(dev_, spec.ffn.act);
  Stream& s = dev_.compute_stream();
  ops::rmsnorm_forward(dev_, s, in.n.as<float>(), in.rstd.as<float>(), x, param(0), T, hidden_, eps_);
  return in;
}

void ResidualMlpBlock::forward(const Tensor& x, const Tensor& y) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(y, "y") == T, "residual MLP block: y must be [T, H] like x");
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  Internals in = recompute(x.data<float>(), T);
  // y = x + FFN(n): the residual copy, then the FFN's output added into it (in place, y
  // is x: the norm above was x's last reader).
  if (y.raw() != x.raw()) dev_.memcpy_async(y.raw(), x.raw(), x.nbytes(), CopyKind::device_to_device, s);
  swiglu_ffn_forward(dev_, s, T, hidden_, ffn_, in.n.as<float>(), ffn_weights(), in.gate.as<float>(),
                     in.up.as<float>(), in.act.as<float>(), y.data<float>(), /*accumulate_out=*/true);
  // The internals are freed on return: whatever reuses their memory next is ordered
  // after this work on the compute stream.
}

void ResidualMlpBlock::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(dy, "dy") == T && check_shape(dx, "dx") == T, "residual MLP block: token counts differ");
  PB_CHECK_MSG(dx.raw() != x.raw() && dx.raw() != dy.raw(), "residual MLP block: dx must not alias x or dy");
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  const float* xp = x.data<float>();
  Internals in = recompute(xp, T);
  // gate, up and act again; no output (out = null).
  swiglu_ffn_forward(dev_, s, T, hidden_, ffn_, in.n.as<float>(), ffn_weights(), in.gate.as<float>(),
                     in.up.as<float>(), in.act.as<float>(), /*out=*/nullptr, false);
  // dn = the FFN's input gradient, written into n's buffer (n is read for the last time
  // before dn is first written).
  float* n = in.n.as<float>();
  swiglu_ffn_backward(dev_, s, T, hidden_, ffn_, n, ffn_weights(), dy.data<float>(), in.gate.as<float>(),
                      in.up.as<float>(), in.act.as<float>(), ffn_grads(), /*dx=*/n, /*accumulate_dx=*/false);
  // dx = dy (the residual path) + rmsnorm's backward, which adds.
  dev_.memcpy_async(dx.raw(), dy.raw(), dy.nbytes(), CopyKind::device_to_device, s);
  ops::rmsnorm_backward(dev_, s, dx.data<float>(), grad(0), n, xp, param(0), in.rstd.as<float>(), T, hidden_);
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

void ResidualMlpBlock::zero_grad() { ops::fill(dev_, dev_.compute_stream(), grads_.as<float>(), num_parameters(), 0.0f); }

}  // namespace peakbound
