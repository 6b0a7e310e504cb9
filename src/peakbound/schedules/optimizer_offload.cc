#include "peakbound/schedules/optimizer_offload.h"

#include <cstring>
#include <string>

#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"
#include "peakbound/core/stopwatch.h"
#include "peakbound/ops/host_adamw.h"

namespace peakbound {

OffloadedAdamW::OffloadedAdamW(std::string_view schedule, OptimizerContext ctx, ParamShard shard,
                               OptimizerOptions options)
    : OptimizerSchedule(schedule, ctx, shard, options) {
  if (options_.in_place && (ctx_.device.backend() != Backend::cpu || strict_device_memory()))
    throw InvalidArgument("optimizer " + std::string(schedule) + ": in_place needs a device whose memory the host "
                          "addresses (cpu without PEAKBOUND_STRICT_DEVICE=1), not " + ctx_.device.name() +
                          (strict_device_memory() ? " under PEAKBOUND_STRICT_DEVICE=1" : ""));
  state_ = StaggeredBlock(ctx_.host, buffers_.host_state, buffers_.host_state_parts);
  master_ = state_.as<float>(0);
  m_ = state_.as<float>(1);
  v_ = state_.as<float>(2);
}

StaggeredBlock OffloadedAdamW::stage() {
  StaggeredBlock b(ctx_.host, buffers_.host_staging, buffers_.host_staging_parts);
  staging_bytes_ += b.bytes();
  return b;
}

void OffloadedAdamW::load_state(const float* master, const float* m, const float* v) {
  const auto bytes = buffers_.master.bytes;
  if (bytes == 0) return;
  std::memcpy(master_, master, bytes);
  if (m != nullptr) {
    std::memcpy(m_, m, bytes);
    std::memcpy(v_, v, bytes);
  } else {
    std::memset(m_, 0, bytes);
    std::memset(v_, 0, bytes);
  }
}

void OffloadedAdamW::read_state(float* master, float* m, float* v) {
  const auto bytes = buffers_.master.bytes;
  if (bytes == 0) return;
  std::memcpy(master, master_, bytes);
  std::memcpy(m, m_, bytes);
  std::memcpy(v, v_, bytes);
}

void OffloadedAdamW::apply_in_place(const AdamWStepScalars& s, OptimizerStepTimes& times) {
  ctx_.device.synchronize(ctx_.device.compute_stream());  // the gradients are complete
  Stopwatch w;
  // The device's memory is host memory: a host op on the shard itself.
  ops::host_adamw_update(ctx_.pool, options_.simd, s, host_tensors(0, shard_.n, shard_.grads, shard_.params));
  times.update_seconds = w.seconds();
  times.d2h_seconds = times.h2d_seconds = 0;
  times.buckets = 1;
}

AdamWTensors OffloadedAdamW::host_tensors(std::int64_t offset, std::int64_t count, const void* grads,
                                               void* params) {
  return {master_ + offset, m_ + offset, v_ + offset,
          grads, shard_.grad_dtype, params, shard_.param_dtype, count};
}

double OffloadedAdamW::copy_seconds(const CopyStats& now, const CopyStats& before, CopyKind k) {
  auto i = static_cast<std::size_t>(k);
  return now.seconds[i] - before.seconds[i];
}

}  // namespace peakbound
