// OffloadedAdamW: what the two offload schedules share. The fp32 master weights, m
// and v live in host memory (HostMemory, component optimizer) and nothing of the
// optimizer lives on the device; subclasses decide how gradients come down and
// parameters go up. Host staging buffers are tagged `comm`, so the host report
// shows state and staging apart.
#pragma once

#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {

class OffloadedAdamW : public OptimizerSchedule {
 public:
  OffloadedAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  void read_state(float* master, float* m, float* v) override;

  // Bytes of host staging this schedule holds (both directions).
  std::uint64_t host_staging_bytes() const { return staging_bytes_; }

 protected:
  void load_state(const float* master) override;
  // The host tensors for elements [offset, offset + count), reading gradients from
  // `grads` and writing parameters to `params` (host staging, already offset).
  cpu::AdamWTensors host_tensors(std::int64_t offset, std::int64_t count, const void* grads, void* params);
  // Host staging (component comm) for arrays of the given sizes, staggered.
  StaggeredBlock stage(std::initializer_list<std::uint64_t> sizes);

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
