// The least device budget a `bench reach` job can run in: the fixed state of a training
// job (the stores' parameters and gradients, the trainer's shards, the optimizer's device
// state, the aux-loss buffers, the checkpoint ring) at the smallest context the search
// tries, from train_footprint, the function `train` plans with. Every job allocates all
// of it before its first step, so a budget below it is refused by every job: `bench
// reach` checks it before launching any (a budget of 0 or 1KiB used to run every job of
// the search to a table of zeros).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/core/precision.h"
#include "peakbound/model/model_config.h"
#include "peakbound/train/process_groups.h"

namespace peakbound::bench {

struct ReachFixedState {
  std::uint64_t bytes = 0;  // the largest over the job's ranks
  int rank = 0;             // the rank that needs it
  std::string phase;        // the footprint phase it is ("optimizer load" or "optimizer")
};

// One job of `train --schedules schedules --seq-len context --batch 1 --eval-batches 0
// --precision precision` on `world` ranks in `layout` (resolved: no zeros): what its ranks hold whatever the
// routing. Throws InvalidArgument for a schedule list ScheduleSet::parse refuses or a
// layout or model train_footprint refuses.
ReachFixedState reach_fixed_state(const ModelConfig& model, const ParallelLayout& layout, int world,
                                  std::int64_t context, const std::string& schedules,
                                  Precision precision = Precision::f32);

// Refuses (InvalidArgument, one line naming `flag`, the minimum and the configuration
// that needs the least) a `budget` below every configuration's fixed state at the
// smallest context the search tries: no job of the search could fit.
void check_reach_budget(std::uint64_t budget, const std::string& flag, const ModelConfig& model,
                        const ParallelLayout& layout, int world, std::int64_t smallest_context,
                        const std::vector<std::string>& schedules, Precision precision = Precision::f32);

}  // namespace peakbound::bench
