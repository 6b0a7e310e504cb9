#include "peakbound/schedules/optimizer_schedule.h"

#include <cmath>

#include <cstring>

#include "peakbound/core/stopwatch.h"
#include "peakbound/core/error.h"
#include "peakbound/ops/adamw.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/schedules/offload_stream_adamw.h"
#include "peakbound/schedules/optimizer_device.h"
#include "peakbound/schedules/optimizer_offload_serial.h"

namespace peakbound {

OptimizerShape optimizer_shape(const ParamShard& shard) {
  OptimizerShape s;
  s.n = shard.n < 0 ? 0 : static_cast<std::uint64_t>(shard.n);
  s.param_bytes = dtype_size(shard.param_dtype);
  s.grad_bytes = dtype_size(shard.grad_dtype);
  s.master_bytes = s.m_bytes = s.v_bytes = sizeof(float);  // the kernels' fp32 state
  return s;
}

OptimizerSchedule::OptimizerSchedule(std::string_view schedule, OptimizerContext ctx, ParamShard shard,
                                     OptimizerOptions options)
    : ctx_(ctx), shard_(shard), options_(options) {
  for (DType t : {shard_.param_dtype, shard_.grad_dtype})
    if (t != DType::f32 && t != DType::bf16)
      throw InvalidArgument("optimizer: parameters and gradients must be f32 or bf16, got " +
                            std::string(dtype_name(t)));
  if (shard_.n < 0) throw InvalidArgument("optimizer: negative parameter count");
  if (shard_.n > 0 && (!shard_.params || !shard_.grads))
    throw InvalidArgument("optimizer: a non-empty shard needs parameter and gradient buffers");
  if (!simd_level_supported(options_.simd))
    throw Unavailable("optimizer simd " + std::string(simd_level_name(options_.simd)) +
                      " is not supported by this CPU");
  buffers_ = optimizer_buffers(schedule, optimizer_shape(shard_), options_);
}

void OptimizerSchedule::load(const float* master) { restore(master, nullptr, nullptr, 0); }

void OptimizerSchedule::set_gradients(const void* grads) {
  if (shard_.n > 0 && grads == nullptr) throw InvalidArgument("optimizer: null gradients for a non-empty shard");
  shard_.grads = grads;
}

void OptimizerSchedule::restore(const float* master, const float* m, const float* v, std::int64_t steps) {
  if (steps < 0) throw InvalidArgument("optimizer: a restored step count must be >= 0, got " + std::to_string(steps));
  if ((m == nullptr) != (v == nullptr)) throw InvalidArgument("optimizer: restore needs both m and v, or neither");
  load_state(master, m, v);
  steps_ = steps;
  const auto n = shard_.n;
  if (n == 0) return;
  const std::uint64_t bytes = buffers_.load_staging.bytes;
  Buffer staged = ctx_.host.allocate(buffers_.load_staging.component, bytes);
  // Host compute on host memory (the staging): a host op, not a device op.
  if (shard_.param_dtype == DType::bf16) ops::host_to_bf16(staged.as<bf16>(), master, n);
  else std::memcpy(staged.data(), master, bytes);
  copy_to_device(ctx_.device, shard_.params, staged.data(), bytes);
}

GradClip OptimizerSchedule::clip() {
  // The norm is a pass over the device's gradients (a device kernel, ops::sum_squares,
  // after the work that wrote them on the compute stream), then one cross-rank sum: it
  // must be known before any bucket is updated, so it is not part of the pipeline.
  const double local = shard_.n == 0 ? 0.0
                                     : ops::sum_squares(ctx_.device, ctx_.device.compute_stream(), shard_.grads,
                                                        shard_.grad_dtype, shard_.n, {&ctx_.pool, options_.simd});
  const double sum = global_sum_squares(ctx_.comm, local);
  if (options_.adam.max_grad_norm > 0.0f) return clip_factor(sum, options_.adam.max_grad_norm);
  GradClip c;
  c.norm = std::sqrt(sum);
  return c;
}

OptimizerStepTimes OptimizerSchedule::step(float lr) {
  Stopwatch w;
  const GradClip c = clip();
  OptimizerStepTimes t = step(lr, c);
  t.clip_seconds = w.seconds() - t.step_seconds;
  t.step_seconds = w.seconds();
  return t;
}

OptimizerStepTimes OptimizerSchedule::step(float lr, const GradClip& clip) {
  Stopwatch step_watch;
  OptimizerStepTimes t;
  t.clip = clip;
  const AdamWStepScalars s = adamw_step_scalars(options_.adam, steps_ + 1, lr, t.clip.scale);
  if (shard_.n > 0) apply(s, t);
  ++steps_;
  t.step_seconds = step_watch.seconds();
  return t;
}

const std::vector<std::string>& optimizer_schedule_names() {
  static const std::vector<std::string> names = {"device", "offload_serial", "offload_stream"};
  return names;
}

std::unique_ptr<OptimizerSchedule> make_optimizer_schedule(std::string_view name, OptimizerContext ctx,
                                                           ParamShard shard, OptimizerOptions options) {
  if (name == "device") return std::make_unique<DeviceAdamW>(ctx, shard, options);
  if (name == "offload_serial") return std::make_unique<OffloadSerialAdamW>(ctx, shard, options);
  if (name == "offload_stream") return std::make_unique<OffloadStreamAdamW>(ctx, shard, options);
  std::string valid;
  for (const auto& n : optimizer_schedule_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw InvalidArgument("unknown optimizer schedule '" + std::string(name) + "' (use " + valid + ")");
}

}  // namespace peakbound
