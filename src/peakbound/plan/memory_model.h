// The analytic per-device memory model behind `peakbound plan`. For one layout and
// one set of schedules it gives, for each phase of a training step, the bytes live
// per Component; the peak is the maximum over phases of what is live together (not
// the sum of per-component maxima). Formulas: docs/plan.md, one line per term.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/core/ledger.h"
#include "peakbound/model/param_count.h"
#include "peakbound/plan/plan_inputs.h"

namespace peakbound {

enum class Phase : std::uint8_t {
  forward_attention,   // attention of the deepest layer in the forward pass
  forward_mlp,         // MLP / MoE of the deepest layer in the forward pass
  loss,                // LM head and cross-entropy
  backward_attention,  // recompute + backward of attention, last layer first
  backward_mlp,        // recompute + backward of the MLP / MoE
  optimizer,           // the optimizer step
};
inline constexpr std::size_t kNumPhases = 6;
std::string_view phase_name(Phase p);

struct PhaseBytes {
  Phase phase;
  ComponentBytes bytes{};
  std::uint64_t total() const;
};

// Sizes the model derives from the inputs, shown in reports and used by the rules.
struct PlanShapes {
  std::int64_t tokens_per_device = 0;  // T = ceil(sequences * context / cp)
  std::int64_t routed_copies_balanced = 0;  // token-copies an EP rank receives, balanced
  std::int64_t routed_copies_worst = 0;     // ... when every token goes to one rank's experts
  std::int64_t routed_copies = 0;           // ... at the requested skew (baseline dispatch)
  double imbalance = 1.0;                   // busiest rank's load over the mean (skew, capped at worst)
  std::int64_t round_copies = 0;            // PipelinedLLEP receive rows per round (dispatch_sizes_estimate)
  std::int64_t spilled_experts = 0;         // foreign experts' weights a helper holds
  std::int64_t vocab_shard = 0;             // ceil(V / vocab_group)
  std::uint64_t boundary_bytes = 0;         // one checkpoint boundary [T, H]
};

struct PeakEstimate {
  std::array<PhaseBytes, kNumPhases> phases{};
  ComponentBytes component_peak{};  // per component, max over phases
  std::uint64_t peak = 0;           // max over phases of the phase total
  Phase binding_phase = Phase::forward_attention;
  Component binding_component = Component::params;  // largest component of the binding phase
  std::uint64_t host_bytes = 0;     // host memory this device's rank needs
  ComponentBytes host{};            // ... per component
  Component host_binding_component = Component::optimizer;  // its largest component
  // Where the numbers come from: the trainer's own footprint when the inputs describe a
  // run `peakbound train` executes (plan/trainer_plan.h: exact, measured == footprint),
  // otherwise this file's analytic estimate; estimate_reason says why it is one.
  bool trainer_footprint = false;
  std::string estimate_reason;
  // Whether the estimate keeps every layer's attention output (PlanInputs::keep_attention,
  // or the policy's choice under keep_attention_by_budget).
  bool keep_attention = false;
  // Whether it keeps Ring-DTP's logits blocks (PlanInputs::keep_logits, or the policy's
  // choice under keep_logits_by_budget).
  bool keep_logits = false;
  // Whether it keeps the routed experts' forward (PlanInputs::keep_experts, or the
  // policy's choice under keep_experts_by_budget).
  bool keep_experts = false;
};

PlanShapes plan_shapes(const PlanInputs& in, const ParamCount& pc);
// The estimate with `schedules` replacing the baseline rules of their components: the
// trainer's footprint (plan/trainer_plan.h) for a run the trainer executes, else the
// analytic model below.
PeakEstimate estimate_peak(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& schedules);

}  // namespace peakbound
