#include "peakbound/plan/trainer_plan.h"

#include <algorithm>
#include <numeric>

#include "peakbound/core/error.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/train/run.h"

namespace peakbound {

namespace {

constexpr std::int64_t kF32Bytes = 4;  // gradients and optimizer state in both precisions
std::size_t C(Component c) { return static_cast<std::size_t>(c); }

}  // namespace

std::optional<std::string> not_a_trainer_run(const PlanInputs& in) {
  if (in.analytic) return std::string("the analytic estimate was asked for");
  try {
    check_trainable(in.model);
  } catch (const InvalidArgument& e) {
    return std::string("the trainer cannot train this model (") + e.what() + ")";
  }
  // The trainer's two precisions: parameters and activations both bf16 (2 bytes) or both
  // f32 (4), gradients and optimizer state f32 in either.
  if (in.param_bytes != in.activation_bytes || !in.activation_precision())
    return std::string("parameters of ") + std::to_string(in.param_bytes) + " and activations of " +
           std::to_string(in.activation_bytes) + " bytes (the trainer runs both in bf16 or both in f32: --precision)";
  if (in.grad_bytes != kF32Bytes)
    return std::string("gradients of ") + std::to_string(in.grad_bytes) +
           " bytes (the trainer reduces gradients in fp32: --grad-dtype f32)";
  if (in.optimizer_state_bytes != kF32Bytes) return std::string("optimizer state that is not f32");
  if (in.fsdp_size() != in.devices) return std::string("an FSDP group smaller than the devices (the trainer shards over all)");
  try {
    check_context_split(in.cp, in.context);
  } catch (const InvalidArgument&) {
    return std::string("a context shorter than 2 x cp (the trainer refuses it)");
  }
  if (in.devices > std::int64_t{1} << 20) return std::string("more devices than the trainer's footprint is evaluated for");
  return std::nullopt;
}

TrainFootprintInputs trainer_footprint_inputs(const PlanInputs& in, const ScheduleSet& schedules, double imbalance,
                                              int rank) {
  // The trainer's own inputs (train/run.h) for a run of the planner's shape, every other
  // setting at the trainer's default (the optimizer schedule, the held-out evaluation).
  RunSettings run;
  run.seq_len = in.context;
  run.batch = in.sequences;
  run.schedules = schedules;
  run.precision = *in.activation_precision();
  RunShape shape{in.model, ParallelLayout{in.ep, in.vocab_group, in.cp}, model_schedules(schedules, run.precision)};
  shape.config.ulysses_attention = schedules.any() && in.context_attention == "ulysses";  // the baseline's: the ring
  shape.schedules.attention_threads = in.attention_threads;
  TrainFootprintInputs t = run_footprint_inputs(run, shape, static_cast<int>(in.devices), rank);
  // The planner's knobs over the schedules' defaults; the dispatch at the plan's imbalance.
  ModelSchedules& s = t.schedules;
  s.dispatch_options = in.dispatch_options();
  s.vocab.chunk = in.vocab_chunk;
  s.checkpoint.prefetch_depth = in.planned_prefetch_depth();
  s.keep_attention = in.keep_attention;
  s.vocab.keep_logits = in.keep_logits;
  s.keep_experts = in.keep_experts;
  // The scheduled side's embedding (make_plan resolved auto); the baseline's is FSDP's.
  if (schedules.any()) s.vocab_parallel_embedding = in.embedding == "vocab";
  if (schedules.sco) {
    s.checkpoint.resident_layers = in.resident_layers;
    s.checkpoint.group_layers = in.planned_checkpoint_group();
  }
  t.optimizer_options.bucket_bytes = in.adam_bucket;
  // A plan is for any device: OffloadStreamAdamW staged through host buckets, as across
  // PCIe (a CPU-device run updates in place and holds the four buckets less host memory).
  t.optimizer_options.in_place = false;
  t.skew = imbalance;
  return t;
}

Phase planner_phase_of(std::string_view p) {
  if (p.starts_with("optimizer")) return Phase::optimizer;
  if (p == "embedding forward" || p.starts_with("forward attention")) return Phase::forward_attention;
  if (p.starts_with("forward ")) return Phase::forward_mlp;
  if (p.starts_with("loss ") || p.starts_with("final norm ") || p == "embedding eval") return Phase::loss;
  if (p.starts_with("backward attention") || p == "embedding backward") return Phase::backward_attention;
  if (p.starts_with("backward ")) return Phase::backward_mlp;
  // A checkpoint group's recomputation runs in the backward.
  if (p.starts_with("recompute attention")) return Phase::backward_attention;
  if (p.starts_with("recompute ")) return Phase::backward_mlp;
  throw InvalidArgument("the planner has no phase for the trainer's phase '" + std::string(p) + "'");
}

PeakEstimate trainer_estimate(const PlanInputs& in, const PlanShapes& shapes, const ScheduleSet& schedules) {
  PeakEstimate e;
  e.trainer_footprint = true;
  for (std::size_t i = 0; i < kNumPhases; ++i) e.phases[i].phase = static_cast<Phase>(i);
  std::array<std::uint64_t, kNumPhases> phase_total{};
  std::array<bool, kNumPhases> seen{};
  ComponentBytes reserve{};
  reserve[C(Component::comm)] = in.comm_reserve;
  reserve[C(Component::workspace)] = in.workspace_reserve;
  auto plus_reserve = [&](ComponentBytes b) {
    for (std::size_t i = 0; i < kNumComponents; ++i) b[i] = checked_add(b[i], reserve[i], "a planned phase");
    return b;
  };
  // Ranks differ only by their position in the ep, vocabulary and cp groups.
  const std::int64_t distinct = std::min<std::int64_t>(in.devices, std::lcm(std::lcm(in.ep, in.vocab_group), in.cp));
  for (std::int64_t r = 0; r < distinct; ++r) {
    const Footprint f = train_footprint(trainer_footprint_inputs(in, schedules, shapes.imbalance, static_cast<int>(r)));
    for (const Footprint::Phase& p : f.phases()) {
      const auto i = static_cast<std::size_t>(planner_phase_of(p.name));
      const ComponentBytes b = plus_reserve(p.device);
      std::uint64_t total = 0;
      for (std::uint64_t x : b) total = checked_add(total, x, "a planned phase");
      if (!seen[i] || total > phase_total[i]) {
        seen[i] = true;
        phase_total[i] = total;
        e.phases[i].bytes = b;
      }
      for (std::size_t c = 0; c < kNumComponents; ++c) e.component_peak[c] = std::max(e.component_peak[c], b[c]);
      if (total > e.peak) {
        e.peak = total;
        e.binding_phase = static_cast<Phase>(i);
      }
    }
    const ComponentBytes host = f.host_peak();
    for (std::size_t c = 0; c < kNumComponents; ++c) e.host[c] = std::max(e.host[c], host[c]);
    e.host_bytes = std::max(e.host_bytes, f.host_peak_total());
  }
  const PhaseBytes& bind = e.phases[static_cast<std::size_t>(e.binding_phase)];
  std::size_t best = 0;
  for (std::size_t i = 1; i < kNumComponents; ++i)
    if (bind.bytes[i] > bind.bytes[best]) best = i;
  e.binding_component = kAllComponents[best];
  for (std::size_t i = 0; i < kNumComponents; ++i)
    if (e.host[i] > e.host[static_cast<std::size_t>(e.host_binding_component)]) e.host_binding_component = kAllComponents[i];
  e.keep_attention = in.keep_attention;
  e.keep_logits = in.keep_logits;
  e.keep_experts = in.keep_experts;
  return e;
}

}  // namespace peakbound
