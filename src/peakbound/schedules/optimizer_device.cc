#include "peakbound/schedules/optimizer_device.h"

#include "peakbound/core/stopwatch.h"
#include "peakbound/ops/adamw.h"
#include "peakbound/ops/elementwise.h"

namespace peakbound {

DeviceAdamW::DeviceAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options)
    : OptimizerSchedule("device", ctx, shard, options) {
  Device& dev = ctx_.device;
  master_ = dev.allocate(buffers_.master.component, buffers_.master.bytes);
  m_ = dev.allocate(buffers_.m.component, buffers_.m.bytes);
  v_ = dev.allocate(buffers_.v.component, buffers_.v.bytes);
}

void DeviceAdamW::load_state(const float* master, const float* m, const float* v) {
  if (shard_.n == 0) return;
  copy_to_device(ctx_.device, master_.data(), master, buffers_.master.bytes);
  if (m != nullptr) {
    copy_to_device(ctx_.device, m_.data(), m, buffers_.m.bytes);
    copy_to_device(ctx_.device, v_.data(), v, buffers_.v.bytes);
    return;
  }
  Device& dev = ctx_.device;
  Stream& s = dev.compute_stream();
  ops::fill(dev, s, m_.as<float>(), shard_.n, 0.0f);
  ops::fill(dev, s, v_.as<float>(), shard_.n, 0.0f);
  dev.synchronize(s);
}

void DeviceAdamW::apply(const AdamWStepScalars& s, OptimizerStepTimes& times) {
  Stopwatch w;
  Device& dev = ctx_.device;
  AdamWTensors t{master_.as<float>(), m_.as<float>(), v_.as<float>(), shard_.grads, shard_.grad_dtype,
                      shard_.params, shard_.param_dtype, shard_.n};
  ops::adamw_update(dev, dev.compute_stream(), s, t, {&ctx_.pool, options_.simd});
  dev.synchronize(dev.compute_stream());
  times.update_seconds = w.seconds();
  times.buckets = 1;
}

void DeviceAdamW::read_state(float* master, float* m, float* v) {
  if (shard_.n == 0) return;
  copy_to_host(ctx_.device, master, master_.data(), buffers_.master.bytes);
  copy_to_host(ctx_.device, m, m_.data(), buffers_.m.bytes);
  copy_to_host(ctx_.device, v, v_.data(), buffers_.v.bytes);
}

}  // namespace peakbound
