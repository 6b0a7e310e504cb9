// A whole plan: the model's parameter count, the shapes the rules derive, the
// baseline (FSDP2-style) and scheduled estimates, whether each fits, the context
// reach of both when asked, and for a plan that does not fit, what would fix it.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/plan/memory_model.h"

namespace peakbound {

struct Reach {
  std::int64_t baseline = 0;   // largest context that fits; 0 if none does
  std::int64_t scheduled = 0;
  std::optional<double> ratio;  // scheduled / baseline; empty when the baseline fits nothing
};

struct Plan {
  PlanInputs inputs;
  ParamCount params;
  PlanShapes shapes;
  PeakEstimate baseline;
  PeakEstimate scheduled;
  bool fits_baseline = false;   // device and host memory
  bool fits_scheduled = false;
  bool fits_host_baseline = true;
  bool fits_host_scheduled = true;
  // SCO's selective policy: boundaries it kept resident on the device so that the host
  // memory fits (unset when it offloads all but the ring, or --resident-layers was given).
  std::optional<std::int64_t> policy_resident_layers;
  // SCO's ring depth the scheduled plan was made at (the policy's when prefetch_depth is -1).
  std::int64_t prefetch_depth = 0;
  // Layers per checkpoint group the scheduled plan was made at (the policy's when
  // checkpoint_group is -1).
  std::int64_t checkpoint_group = 1;
  // With embedding "auto" on the trainer's footprint: the scheduled peak with the FSDP
  // embedding and with the vocabulary-parallel one (inputs.embedding says which was taken).
  std::optional<std::pair<std::uint64_t, std::uint64_t>> embedding_peaks;
  // With context_attention "auto" where Ulysses can run: the scheduled peak with the ring
  // and with Ulysses (inputs.context_attention says which was taken).
  std::optional<std::pair<std::uint64_t, std::uint64_t>> context_attention_peaks;
  std::optional<Reach> reach;
  std::vector<std::string> fixes;  // for a scheduled plan that does not fit
};

// Throws InvalidArgument for inconsistent inputs.
Plan make_plan(const PlanInputs& in, bool with_reach);

// The estimate under `schedules`, with SCO's selective policy applied: when the host
// memory cannot hold the offloaded boundaries, the fewest boundaries that make it fit
// stay resident on the device (*resident_layers says how many; unset if none moved);
// with prefetch_depth -1, a ring of one slot (depth 0) when the device does not hold the
// plan with the default two (*prefetch_depth says which depth the estimate is at); with
// checkpoint_group -1, where the plan still does not fit, the fewest layers a checkpoint
// group with which it does (*checkpoint_group says which group the estimate is at).
PeakEstimate estimate_with_policy(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& schedules,
                                  std::optional<std::int64_t>* resident_layers = nullptr,
                                  std::int64_t* prefetch_depth = nullptr, std::int64_t* checkpoint_group = nullptr);
// Device peak within device_memory and host bytes within the device's host share.
bool fits_memory(const PlanInputs& in, const PeakEstimate& e);

// Largest context (tokens per sequence) whose peak fits the device memory under
// `schedules`: doubling from 1024, then bisection to the exact token. 0 if even 1
// token does not fit; capped at 2^31.
std::int64_t context_reach(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& schedules);

nlohmann::json plan_json(const Plan& p);
std::string plan_table(const Plan& p);

}  // namespace peakbound
