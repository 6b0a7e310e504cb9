// OffloadedAdamW: what the two offload schedules share. The fp32 master weights, m
// and v live in host memory (HostMemory, component optimizer: one StaggeredBlock, the
// spec buffers().host_state) and nothing of the optimizer lives on the device;
// subclasses decide how gradients come down and parameters go up. Host staging
// (buffers().host_staging) is tagged `comm`, so the host report shows state and
// staging apart. The update is host compute on host memory: a host op
// (ops/host_adamw.h), not a device op, whatever the device.
#pragma once

#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {

class OffloadedAdamW : public OptimizerSchedule {
 public:
  OffloadedAdamW(std::string_view schedule, OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  void read_state(float* master, float* m, float* v) override;

  // Bytes of host staging this schedule holds (both directions).
  std::uint64_t host_staging_bytes() const { return staging_bytes_; }

 protected:
  void load_state(const float* master, const float* m, const float* v) override;
  // The host tensors for elements [offset, offset + count), reading gradients from
  // `grads` and writing parameters to `params` (host staging, already offset).
  AdamWTensors host_tensors(std::int64_t offset, std::int64_t count, const void* grads, void* params);
  // The host staging of buffers().host_staging, its parts in host_staging_parts' order.
  StaggeredBlock stage();
  // OptimizerOptions::in_place: the whole shard's update where it lies, after the work
  // that wrote the gradients (no staging, no copies).
  void apply_in_place(const AdamWStepScalars& s, OptimizerStepTimes& times);

  // Busy seconds of the device's copy engines in one direction since `before`.
  static double copy_seconds(const CopyStats& now, const CopyStats& before, CopyKind k);

  StaggeredBlock state_;  // master, m, v
  float* master_;
  float* m_;
  float* v_;

 private:
  std::uint64_t staging_bytes_ = 0;
};

}  // namespace peakbound
