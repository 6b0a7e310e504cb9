// OffloadSerialAdamW, the `offload_serial` baseline: the state in host memory; a
// step copies all gradients device -> host, then runs the whole CPU update, then
// copies all parameters host -> device, one stage after the other (what optimizer
// offload commonly does). Host staging holds every gradient and every parameter.
#pragma once

#include "peakbound/schedules/optimizer_offload.h"

namespace peakbound {

class OffloadSerialAdamW final : public OffloadedAdamW {
 public:
  OffloadSerialAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  std::string_view name() const override { return "offload_serial"; }

 protected:
  void apply(const AdamWStepScalars& s, OptimizerStepTimes& times) override;

 private:
  StaggeredBlock staging_;  // every gradient, every parameter
  void* grads_host_ = nullptr;
  void* params_host_ = nullptr;
};

}  // namespace peakbound
