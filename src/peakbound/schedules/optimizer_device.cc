#include "peakbound/schedules/optimizer_device.h"

#include <cstring>

#include "peakbound/bench/harness.h"

namespace peakbound {

DeviceAdamW::DeviceAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options)
    : OptimizerSchedule(ctx, shard, options) {
  const auto bytes = static_cast<std::uint64_t>(shard_.n) * 4;
  state_ = StaggeredBlock(ctx_.device.arena(), Component::optimizer, {bytes, bytes, bytes});
  master_ = state_.as<float>(0);
  m_ = state_.as<float>(1);
  v_ = state_.as<float>(2);
}

void DeviceAdamW::load_state(const float* master) {
  const auto bytes = static_cast<std::uint64_t>(shard_.n) * 4;
  if (bytes == 0) return;
  copy_and_wait(master_, master, bytes, CopyKind::host_to_device);
  // Zeroing is a device kernel; the CPU device's memory is the caller's to write.
  std::memset(m_, 0, bytes);
  std::memset(v_, 0, bytes);
}

void DeviceAdamW::apply(const cpu::AdamWStepScalars& s, OptimizerStepTimes& times) {
  bench::Stopwatch w;
  cpu::AdamWTensors t{master_, m_, v_, shard_.grads, shard_.grad_dtype,
                      shard_.params, shard_.param_dtype, shard_.n};
  cpu::adamw_update_parallel(ctx_.pool, options_.simd, s, t);
  times.update_seconds = w.seconds();
  times.buckets = 1;
}

void DeviceAdamW::read_state(float* master, float* m, float* v) {
  const auto bytes = static_cast<std::uint64_t>(shard_.n) * 4;
  if (bytes == 0) return;
  copy_and_wait(master, master_, bytes, CopyKind::device_to_host);
  copy_and_wait(m, m_, bytes, CopyKind::device_to_host);
  copy_and_wait(v, v_, bytes, CopyKind::device_to_host);
}

}  // namespace peakbound
