#include "peakbound/bench/checkpoint_run.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/core/error.h"
#include "peakbound/core/dtype.h"
#include "peakbound/schedules/checkpoint_policy.h"

namespace peakbound {

std::int64_t CheckpointRunConfig::resolved_ffn() const {
  if (ffn > 0) return ffn;
  return (8 * hidden / 3 + 63) / 64 * 64;
}

void CheckpointRunConfig::validate() const {
  if (layers < 1) throw InvalidArgument("checkpoint run layers must be >= 1 (got " + std::to_string(layers) + ")");
  if (tokens < 1) throw InvalidArgument("checkpoint run tokens must be >= 1 (got " + std::to_string(tokens) + ")");
  if (hidden < 1) throw InvalidArgument("checkpoint run hidden must be >= 1 (got " + std::to_string(hidden) + ")");
  if (ffn < 0)
    throw InvalidArgument("checkpoint run ffn must be positive, or 0 for 8/3 of hidden (got " + std::to_string(ffn) + ")");
  if (device_memory && *device_memory == 0)
    throw InvalidArgument("checkpoint run device_memory must be > 0 (leave it unset for automatic)");
  validate_checkpoint_options(options);
}

CheckpointRunBuffers checkpoint_run_buffers(const CheckpointRunConfig& c, std::uint64_t elem_bytes) {
  c.validate();
  const std::int64_t T = c.tokens, H = c.hidden, F = c.resolved_ffn();
  const auto th = checked_mul(static_cast<std::uint64_t>(T), static_cast<std::uint64_t>(H), "checkpoint run [T, H]");
  CheckpointRunBuffers b;
  b.block_params = residual_mlp_param_buffers(H, F, elem_bytes);
  b.io = buffer_spec(Component::layer, th, elem_bytes);
  b.stack = checkpoint_buffers(c.layers, th, elem_bytes, c.options);
  b.block_internals = residual_mlp_internals(T, H, F, elem_bytes);
  return b;
}

Footprint checkpoint_run_footprint(const CheckpointRunConfig& c, std::uint64_t elem_bytes) {
  const CheckpointRunBuffers b = checkpoint_run_buffers(c, elem_bytes);
  const auto L = static_cast<std::uint64_t>(c.layers);
  Footprint f("checkpoint run " + std::string(checkpoint_schedule_name(c.options.schedule)));
  f.merge(checkpoint_footprint(b.stack));
  for (const char* phase : {"forward", "backward"}) {
    f.device(phase, b.block_params.params, L).device(phase, b.block_params.grads, L);
    f.device(phase, b.io, 4);
    const ResidualMlpInternals& in = b.block_internals;
    f.device(phase, in.n).device(phase, in.rstd);
    f.device(phase, in.ffn.gate).device(phase, in.ffn.up).device(phase, in.ffn.act);
  }
  return f;
}

std::uint64_t auto_device_memory(const CheckpointRunConfig& c) {
  CheckpointRunConfig base = c;
  base.options.schedule = CheckpointSchedule::resident;
  return auto_device_budget(checkpoint_run_footprint(base, dtype_size(DType::f32)).device_peak_total());
}

CheckpointRun::CheckpointRun(const CheckpointRunConfig& config) : config_(config) {
  const CheckpointRunBuffers b = checkpoint_run_buffers(config_, dtype_size(DType::f32));  // validates
  const std::int64_t L = config_.layers, T = config_.tokens, H = config_.hidden, F = config_.resolved_ffn();
  const std::uint64_t budget = config_.device_memory ? *config_.device_memory : auto_device_memory(config_);
  dev_ = make_device(config_.device, budget,
                     std::string("cpu:") + std::string(checkpoint_schedule_name(config_.options.schedule)));
  host_ = std::make_unique<HostMemory>(MemoryLedger::kUnlimited, "host", dev_->host_pages());
  std::vector<Block*> raw;
  for (std::int64_t l = 0; l < L; ++l) {
    blocks_.push_back(std::make_unique<ResidualMlpBlock>(*dev_, H, F, config_.seed + 1000 + static_cast<std::uint64_t>(l)));
    raw.push_back(blocks_.back().get());
  }
  for (Buffer* io : {&x_, &y_, &dy_, &dx_}) *io = dev_->allocate(b.io.component, b.io.bytes);
  std::mt19937_64 rng(config_.seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(T * H)), dy(x.size());
  for (float& v : x) v = unit(rng);
  const float dscale = 1.0f / static_cast<float>(T);
  for (float& v : dy) v = dscale * unit(rng);
  copy_to_device(*dev_, x_.data(), x.data(), x.size() * sizeof(float));
  copy_to_device(*dev_, dy_.data(), dy.data(), dy.size() * sizeof(float));
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
  // The step ends when the device is done: on the CPU device backward has waited for every
  // copy already, but on an asynchronous device (CUDA) backward returns once it has
  // enqueued its work, and the clock would time the launches.
  dev_->synchronize();
  const double seconds = w.seconds();
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
  std::vector<float> out(static_cast<std::size_t>(config_.tokens * config_.hidden));
  copy_to_host(*dev_, out.data(), y_.data(), out.size() * sizeof(float));
  return out;
}

std::vector<float> CheckpointRun::input_grad() const {
  std::vector<float> out(static_cast<std::size_t>(config_.tokens * config_.hidden));
  copy_to_host(*dev_, out.data(), dx_.data(), out.size() * sizeof(float));
  return out;
}

std::vector<float> CheckpointRun::param_grads() const {
  std::vector<float> out;
  for (const auto& b : blocks_)
    for (const Parameter& p : b->parameters()) {
      const std::size_t at = out.size();
      out.resize(at + static_cast<std::size_t>(p.grad.numel()));
      copy_to_host(*dev_, out.data() + at, p.grad.data<float>(), static_cast<std::uint64_t>(p.grad.numel()) * sizeof(float));
    }
  return out;
}

}  // namespace peakbound
