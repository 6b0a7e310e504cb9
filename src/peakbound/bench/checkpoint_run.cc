#include "peakbound/bench/checkpoint_run.h"

#include <cmath>
#include <random>
#include <string>

#include "peakbound/bench/harness.h"
#include "peakbound/core/error.h"
#include "peakbound/schedules/checkpoint_policy.h"

namespace peakbound {

std::int64_t CheckpointRunConfig::resolved_ffn() const {
  if (ffn > 0) return ffn;
  return (8 * hidden / 3 + 63) / 64 * 64;
}

void CheckpointRunConfig::validate() const {
  if (layers < 1) throw InvalidArgument("--layers must be at least 1 (got " + std::to_string(layers) + ")");
  if (tokens < 1) throw InvalidArgument("--tokens must be at least 1 (got " + std::to_string(tokens) + ")");
  if (hidden < 1) throw InvalidArgument("--hidden must be at least 1 (got " + std::to_string(hidden) + ")");
  if (ffn < 0) throw InvalidArgument("--ffn must be positive, or 0 for 8/3 of --hidden (got " + std::to_string(ffn) + ")");
}

std::uint64_t auto_device_memory(const CheckpointRunConfig& c) {
  const auto T = static_cast<std::uint64_t>(c.tokens), H = static_cast<std::uint64_t>(c.hidden);
  const auto F = static_cast<std::uint64_t>(c.resolved_ffn()), L = static_cast<std::uint64_t>(c.layers);
  const std::uint64_t params = arena_rounded((H + 3 * H * F) * 4);
  const std::uint64_t act = arena_rounded(T * H * 4);
  const std::uint64_t internals = 2 * act + arena_rounded(T * 4) + 3 * arena_rounded(T * F * 4);
  const std::uint64_t need = 2 * L * params + (4 + L + 2) * act + internals;
  return need + need / 4 + (16ull << 20);
}

CheckpointRun::CheckpointRun(const CheckpointRunConfig& config) : config_(config) {
  config_.validate();
  const std::int64_t L = config_.layers, T = config_.tokens, H = config_.hidden, F = config_.resolved_ffn();
  const std::uint64_t budget = config_.device_memory ? config_.device_memory : auto_device_memory(config_);
  dev_ = std::make_unique<CpuDevice>(budget, std::string("cpu:") + std::string(checkpoint_schedule_name(config_.options.schedule)));
  host_ = std::make_unique<HostMemory>();
  std::vector<Block*> raw;
  for (std::int64_t l = 0; l < L; ++l) {
    blocks_.push_back(std::make_unique<ResidualMlpBlock>(*dev_, H, F, config_.seed + 1000 + static_cast<std::uint64_t>(l)));
    raw.push_back(blocks_.back().get());
  }
  const std::uint64_t act = static_cast<std::uint64_t>(T * H) * sizeof(float);
  x_ = dev_->allocate(Component::layer, act);
  y_ = dev_->allocate(Component::layer, act);
  dy_ = dev_->allocate(Component::layer, act);
  dx_ = dev_->allocate(Component::layer, act);
  std::mt19937_64 rng(config_.seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t i = 0; i < T * H; ++i) x_.as<float>()[i] = unit(rng);
  const float dscale = 1.0f / static_cast<float>(T);
  for (std::int64_t i = 0; i < T * H; ++i) dy_.as<float>()[i] = dscale * unit(rng);
  stack_ = std::make_unique<CheckpointedStack>(*dev_, *host_, raw, Shape{T, H}, DType::f32, config_.options);
}

CheckpointRun::~CheckpointRun() {
  stack_.reset();  // drains its copies before the buffers they touch go away
}

double CheckpointRun::step() {
  for (auto& b : blocks_) b->zero_grad();
  const std::int64_t T = config_.tokens, H = config_.hidden;
  Tensor y(y_.data(), Shape{T, H}, DType::f32, Location::device);
  Tensor dx(dx_.data(), Shape{T, H}, DType::f32, Location::device);
  const CopyStats before = dev_->copy_stats();
  const double wait_before = stack_->link().emulated_wait_seconds();
  const double stall_before = stack_->stall_seconds();
  bench::Stopwatch w;
  stack_->forward(input(), y);
  stack_->backward(output_grad(), dx);
  const double seconds = w.seconds();
  // Every copy has been waited on by backward; synchronize anyway so the stats are final.
  dev_->synchronize();
  const CopyStats after = dev_->copy_stats();
  const auto d2h = static_cast<std::size_t>(CopyKind::device_to_host);
  const auto h2d = static_cast<std::size_t>(CopyKind::host_to_device);
  copy_step_.d2h_bytes = after.bytes[d2h] - before.bytes[d2h];
  copy_step_.h2d_bytes = after.bytes[h2d] - before.bytes[h2d];
  copy_step_.memcpy_seconds = (after.seconds[d2h] - before.seconds[d2h]) + (after.seconds[h2d] - before.seconds[h2d]);
  copy_step_.link_wait_seconds = stack_->link().emulated_wait_seconds() - wait_before;
  copy_step_.stall_seconds = stack_->stall_seconds() - stall_before;
  return seconds;
}

Tensor CheckpointRun::input() const {
  return Tensor(x_.data(), Shape{config_.tokens, config_.hidden}, DType::f32, Location::device);
}

Tensor CheckpointRun::output_grad() const {
  return Tensor(dy_.data(), Shape{config_.tokens, config_.hidden}, DType::f32, Location::device);
}

std::vector<float> CheckpointRun::output() const {
  const auto n = static_cast<std::size_t>(config_.tokens * config_.hidden);
  return {y_.as<float>(), y_.as<float>() + n};
}

std::vector<float> CheckpointRun::input_grad() const {
  const auto n = static_cast<std::size_t>(config_.tokens * config_.hidden);
  return {dx_.as<float>(), dx_.as<float>() + n};
}

std::vector<float> CheckpointRun::param_grads() const {
  std::vector<float> out;
  for (const auto& b : blocks_)
    for (const Parameter& p : b->parameters()) {
      const float* g = p.grad.data<float>();
      out.insert(out.end(), g, g + p.grad.numel());
    }
  return out;
}

}  // namespace peakbound
