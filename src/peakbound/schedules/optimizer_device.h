// DeviceAdamW, the `device` baseline: fp32 master weights, m and v live in the
// device Arena (component optimizer, 12 bytes per parameter) and the update runs on
// the device, reading the gradients and writing the parameters in place. No copies;
// the most device memory.
#pragma once

#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {

class DeviceAdamW final : public OptimizerSchedule {
 public:
  DeviceAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  std::string_view name() const override { return "device"; }
  void read_state(float* master, float* m, float* v) override;

 protected:
  void load_state(const float* master) override;
  void apply(const cpu::AdamWStepScalars& s, OptimizerStepTimes& times) override;

 private:
  StaggeredBlock state_;  // master, m, v
  float* master_;
  float* m_;
  float* v_;
};

}  // namespace peakbound
