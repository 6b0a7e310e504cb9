#include "peakbound/schedules/offload_stream_adamw.h"

#include <algorithm>
#include <string>

#include "peakbound/core/stopwatch.h"
#include "peakbound/ops/host_adamw.h"

namespace peakbound {

OffloadStreamAdamW::OffloadStreamAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options)
    : OffloadedAdamW("offload_stream", ctx, shard, options),
      bucket_(std::max<std::int64_t>(1, static_cast<std::int64_t>(buffers_.bucket_elements))),
      d2h_(ctx.device.copy_stream()),
      h2d_(ctx.device.create_stream("h2d")) {
  if (options_.in_place) return;
  staging_ = stage();
  for (int slot = 0; slot < 2; ++slot) {
    grads_slot_[slot] = staging_.part(static_cast<std::size_t>(slot));
    params_slot_[slot] = staging_.part(static_cast<std::size_t>(2 + slot));
  }
}

void OffloadStreamAdamW::apply(const AdamWStepScalars& s, OptimizerStepTimes& times) {
  if (options_.in_place) return apply_in_place(s, times);
  Device& dev = ctx_.device;
  const std::uint64_t gsize = dtype_size(shard_.grad_dtype), psize = dtype_size(shard_.param_dtype);
  const std::int64_t buckets = bucket_count();
  auto first = [&](std::int64_t i) { return i * bucket_; };
  auto count = [&](std::int64_t i) { return std::min(bucket_, shard_.n - first(i)); };

  const CopyStats before = dev.copy_stats();
  Event grads_landed[2], params_sent[2];  // per staging slot
  auto fetch = [&](std::int64_t i) {
    const auto slot = static_cast<std::size_t>(i % 2);
    dev.memcpy_async(grads_slot_[slot],
                     static_cast<const char*>(shard_.grads) + static_cast<std::uint64_t>(first(i)) * gsize,
                     static_cast<std::uint64_t>(count(i)) * gsize, CopyKind::device_to_host, d2h_);
    grads_landed[slot] = dev.record(d2h_);
  };

  dev.wait(d2h_, dev.record(dev.compute_stream()));  // the gradients are complete
  fetch(0);
  double update = 0;
  for (std::int64_t i = 0; i < buckets; ++i) {
    const auto slot = static_cast<std::size_t>(i % 2);
    // Slot (i+1)%2 held bucket i-1's gradients, whose update has returned: refill it.
    if (i + 1 < buckets) fetch(i + 1);
    grads_landed[slot].synchronize();
    params_sent[slot].synchronize();  // bucket i-2's parameters have left this slot
    Stopwatch w;
    // Host compute on host memory: a host op, not a device op.
    ops::host_adamw_update(ctx_.pool, options_.simd, s,
                           host_tensors(first(i), count(i), grads_slot_[slot], params_slot_[slot]));
    update += w.seconds();
    dev.memcpy_async(static_cast<char*>(shard_.params) + static_cast<std::uint64_t>(first(i)) * psize,
                     params_slot_[slot], static_cast<std::uint64_t>(count(i)) * psize,
                     CopyKind::host_to_device, h2d_);
    params_sent[slot] = dev.record(h2d_);
  }
  dev.synchronize(h2d_);
  dev.synchronize(d2h_);
  const CopyStats after = dev.copy_stats();
  times.update_seconds = update;
  times.d2h_seconds = copy_seconds(after, before, CopyKind::device_to_host);
  times.h2d_seconds = copy_seconds(after, before, CopyKind::host_to_device);
  times.buckets = buckets;
}

}  // namespace peakbound
