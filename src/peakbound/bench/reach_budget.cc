#include "peakbound/bench/reach_budget.h"

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/schedules/schedule_set.h"
#include "peakbound/train/run.h"
#include "peakbound/train/train_footprint.h"

namespace peakbound::bench {

ReachFixedState reach_fixed_state(const ModelConfig& model, const ParallelLayout& layout, int world,
                                  std::int64_t context, const std::string& schedules, Precision precision) {
  // The footprint inputs `train` plans with (train/run.h), for one sequence of `context`
  // tokens and the worst routing the layout allows; no held-out loss (its phase is not
  // one of the two below).
  RunSettings settings;
  settings.schedules = ScheduleSet::parse(schedules);
  settings.seq_len = context;
  settings.batch = 1;
  settings.eval_batches = 0;
  settings.plan_skew = 0;
  settings.precision = precision;
  const RunShape shape{model, layout, model_schedules(settings.schedules, settings.precision)};
  TrainFootprintInputs in = run_footprint_inputs(settings, shape, world, 0);
  ReachFixedState worst;
  for (int r = 0; r < world; ++r) {
    in.rank = r;
    const Footprint f = train_footprint(in);
    // The trainer's construction, and the step's persistent buffers with the stack's ring:
    // both held before and through every step, whatever the routing.
    for (const char* phase : {"optimizer load", "optimizer"}) {
      const std::uint64_t b = f.phase(phase).device_total();
      if (b > worst.bytes) worst = {b, r, phase};
    }
  }
  return worst;
}

void check_reach_budget(std::uint64_t budget, const std::string& flag, const ModelConfig& model,
                        const ParallelLayout& layout, int world, std::int64_t smallest_context,
                        const std::vector<std::string>& schedules, Precision precision) {
  if (schedules.empty()) return;
  ReachFixedState least;
  std::string leanest;
  for (const std::string& s : schedules) {
    const ReachFixedState st = reach_fixed_state(model, layout, world, smallest_context, s, precision);
    if (leanest.empty() || st.bytes < least.bytes) least = st, leanest = s;
  }
  if (budget >= least.bytes) return;
  throw InvalidArgument(flag + " " + format_bytes(static_cast<double>(budget)) + " cannot hold even the smallest job: " +
                        model.name + "'s fixed state (parameters, gradients, optimizer state, checkpoint ring) at " +
                        std::to_string(smallest_context) + " tokens needs " + std::to_string(least.bytes) + " bytes (" +
                        format_bytes(static_cast<double>(least.bytes)) + ") per rank under the leanest configuration (" +
                        leanest + "); give at least that");
}

}  // namespace peakbound::bench
