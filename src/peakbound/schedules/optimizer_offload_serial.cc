#include "peakbound/schedules/optimizer_offload_serial.h"

#include "peakbound/core/stopwatch.h"
#include "peakbound/ops/host_adamw.h"

namespace peakbound {

OffloadSerialAdamW::OffloadSerialAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options)
    : OffloadedAdamW("offload_serial", ctx, shard, options) {
  if (options_.in_place) return;
  staging_ = stage();
  grads_host_ = staging_.part(0);
  params_host_ = staging_.part(1);
}

void OffloadSerialAdamW::apply(const AdamWStepScalars& s, OptimizerStepTimes& times) {
  if (options_.in_place) return apply_in_place(s, times);
  Device& dev = ctx_.device;
  Stream& copy = dev.copy_stream();
  const auto n = static_cast<std::uint64_t>(shard_.n);
  const CopyStats before = dev.copy_stats();
  dev.wait(copy, dev.record(dev.compute_stream()));  // the gradients are complete
  dev.memcpy_async(grads_host_, shard_.grads, n * dtype_size(shard_.grad_dtype),
                   CopyKind::device_to_host, copy);
  dev.synchronize(copy);
  Stopwatch w;
  // f32 parameters are the master weights themselves: the update writes no copy of
  // them (4 bytes less per parameter to move) and the master goes to the device.
  void* params = shard_.param_dtype == DType::f32 ? static_cast<void*>(master_) : params_host_;
  // Host compute on host memory: a host op, not a device op.
  ops::host_adamw_update(ctx_.pool, options_.simd, s, host_tensors(0, shard_.n, grads_host_, params));
  times.update_seconds = w.seconds();
  dev.memcpy_async(shard_.params, params, n * dtype_size(shard_.param_dtype),
                   CopyKind::host_to_device, copy);
  dev.synchronize(copy);
  const CopyStats after = dev.copy_stats();
  times.d2h_seconds = copy_seconds(after, before, CopyKind::device_to_host);
  times.h2d_seconds = copy_seconds(after, before, CopyKind::host_to_device);
  times.buckets = 1;
}

}  // namespace peakbound
