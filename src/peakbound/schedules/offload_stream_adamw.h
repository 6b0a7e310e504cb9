// OffloadStreamAdamW: the state in host memory, the step cut into buckets of
// bucket_bytes of gradients and pipelined in three stages on three engines:
//   D2H of bucket i+1 (the copy stream) | CPU update of bucket i (the caller and the
//   pool) | H2D of bucket i-1 (a second copy stream)
// through double-buffered host staging (two slots per direction). The device holds
// only the parameters and gradients; the host holds the state plus 2 slots of
// staging instead of a full copy of the gradients and parameters. Every element
// sees the same kernel and scalars as the serial step, so the bits are the same for
// any bucket size.
#pragma once

#include "peakbound/schedules/optimizer_offload.h"

namespace peakbound {

class OffloadStreamAdamW final : public OffloadedAdamW {
 public:
  OffloadStreamAdamW(OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  std::string_view name() const override { return "offload_stream"; }

  std::int64_t bucket_elements() const { return bucket_; }
  std::int64_t bucket_count() const { return shard_.n == 0 ? 0 : (shard_.n + bucket_ - 1) / bucket_; }

 protected:
  void apply(const AdamWStepScalars& s, OptimizerStepTimes& times) override;

 private:
  std::int64_t bucket_;  // parameters per bucket
  Stream& d2h_;
  Stream& h2d_;
  StaggeredBlock staging_;  // gradient slots 0, 1, parameter slots 0, 1
  void* grads_slot_[2] = {};
  void* params_slot_[2] = {};
};

}  // namespace peakbound
