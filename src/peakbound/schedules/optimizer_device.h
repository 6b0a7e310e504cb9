// DeviceAdamW, the `device` baseline: fp32 master weights, m and v live in the
// device Arena (component optimizer, 12 bytes per parameter, three allocations that
// the Arena staggers) and the update runs on the device through ops::adamw_update,
// reading the gradients and writing the parameters in place. No copies; the most
// device memory.
#pragma once

#include "peakbound/schedules/optimizer_schedule.h"

namespace peakbound {

class DeviceAdamW final : public OptimizerSchedule {
 public:
  DeviceAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  std::string_view name() const override { return "device"; }
  void read_state(float* master, float* m, float* v) override;

 protected:
  void load_state(const float* master, const float* m, const float* v) override;
  void apply(const AdamWStepScalars& s, OptimizerStepTimes& times) override;

 private:
  Buffer master_, m_, v_;  // buffers().master, .m, .v
};

}  // namespace peakbound
