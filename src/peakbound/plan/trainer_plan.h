// The plan of a run that `peakbound train` can execute: when the planner's inputs
// describe a trainer run exactly (a trainable model, parameters and activations both
// bf16 or both f32 (train --precision), f32 gradients and optimizer state, FSDP over
// every device, a layout the trainer accepts), the planner's per-component peaks are the trainer's own footprint
// (train/train_footprint.h, which the tests check equals the Arena's measured peaks),
// not the analytic estimate. The fixed reserves (comm, workspace) are added on top,
// as in every phase of the estimate.
//
//   component_peak[c] = max over ranks r of train_footprint(r).device_peak(c) (+ reserve)
//   peak              = max over ranks r of train_footprint(r).device_peak_total() (+ reserves)
//   phase p           = the largest-total trainer phase (over ranks) that maps onto p
//
// Ranks differ only by their ep, vocabulary and cp positions (r mod each), so the
// ranks [0, lcm(ep, vocab_group, cp)) stand for all of them.
#pragma once

#include <optional>
#include <string>

#include "peakbound/plan/memory_model.h"
#include "peakbound/train/train_footprint.h"

namespace peakbound {

// Why the planner's inputs are not a run the trainer executes (the first reason), or
// empty when they are. `schedules` is the set being estimated.
std::optional<std::string> not_a_trainer_run(const PlanInputs& in);

// The trainer's footprint inputs for rank `rank` of the run `in` describes under
// `schedules` (knobs: the planner's; dispatch sized at the plan's routing imbalance).
// Requires !not_a_trainer_run(in).
TrainFootprintInputs trainer_footprint_inputs(const PlanInputs& in, const ScheduleSet& schedules, double imbalance,
                                              int rank);

// The estimate from the trainer's footprint (see above). Requires !not_a_trainer_run(in).
PeakEstimate trainer_estimate(const PlanInputs& in, const PlanShapes& shapes, const ScheduleSet& schedules);

// Which planner phase a trainer phase belongs to ("forward mlp (layer 2)" -> forward_mlp).
Phase planner_phase_of(std::string_view trainer_phase);

}  // namespace peakbound
