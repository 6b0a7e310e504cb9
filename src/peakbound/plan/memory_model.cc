#include "peakbound/plan/memory_model.h"
#include "peakbound/plan/trainer_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/layers/attention_footprint.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/layers/mlp_footprint.h"
#include "peakbound/layers/moe_layer.h"
#include "peakbound/schedules/checkpoint_policy.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/schedules/optimizer_footprint.h"
#include "peakbound/schedules/vocab_footprint.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;

u64 U(i64 v) { return static_cast<u64>(std::max<i64>(v, 0)); }
u64 ceil_div_u(u64 a, u64 b) { return a / b + (a % b != 0); }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "a planned size"); }
u64 add(u64 a, u64 b) { return checked_add(a, b, "a planned size"); }
i64 I(u64 v) {
  if (v > static_cast<u64>(std::numeric_limits<i64>::max()))
    throw InvalidArgument("a planned count overflows 64 bits (" + std::to_string(v) + ")");
  return static_cast<i64>(v);
}
i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }
std::size_t C(Component c) { return static_cast<std::size_t>(c); }

// Parameters one rank holds unsharded while computing a layer: the layer's non-expert
// parameters plus its E/EP local experts (the largest such layer).
i64 gathered_layer_params(const PlanInputs& in, const ParamCount& pc) {
  i64 moe = pc.num_moe_layers > 0 ? pc.moe_layer_non_expert + (in.model.num_experts / in.ep) * pc.routed_expert : 0;
  i64 dense = pc.num_dense_layers > 0 ? pc.dense_layer : 0;
  return std::max(moe, dense);
}

}  // namespace

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::forward_attention: return "forward_attention";
    case Phase::forward_mlp: return "forward_mlp";
    case Phase::loss: return "loss";
    case Phase::backward_attention: return "backward_attention";
    case Phase::backward_mlp: return "backward_mlp";
    case Phase::optimizer: return "optimizer";
  }
  PB_CHECK_MSG(false, "unknown phase");
}

std::uint64_t PhaseBytes::total() const {
  u64 t = 0;
  for (u64 b : bytes) t = checked_add(t, b, "a planned phase");
  return t;
}

// The most tokens of one sequence any rank of a cp group holds (schedules/context_layout.h).
i64 widest_shard(i64 context, i64 cp) { return cp == 1 ? context : zigzag_widest_tokens(context, static_cast<int>(cp)); }

// The attention term: the trainer's attention sublayer's own footprint (and ring
// attention's under cp) on the widest shard, at the activations' element size. MLA,
// which the trainer does not implement yet, keeps the shape-level estimate.
Footprint attention_term(const PlanInputs& in, const PlanShapes& s, u64 elem_bytes, bool scheduled) {
  ModelConfig m = in.model;
  m.ulysses_attention = scheduled && in.context_attention == "ulysses";  // the baseline's is the ring
  if (m.attention == AttentionKind::mla)
    return attention_footprint(AttentionShape::of(m, s.tokens_per_device, in.cp), elem_bytes);
  const i64 cp = in.context >= 2 * in.cp ? in.cp : 1;  // shorter: every chunk a token or none
  const int widest_rank = zigzag_widest_rank(in.context, static_cast<int>(cp));
  AttentionLayerConfig ac = model_attention_config(m, in.context, static_cast<int>(cp), widest_rank);
  if (cp == 1) ac.seq_len = widest_shard(in.context, in.cp);
  return attention_layer_footprint(s.tokens_per_device, ac, elem_bytes);
}

PlanShapes plan_shapes(const PlanInputs& in, const ParamCount& pc) {
  (void)pc;
  const ModelConfig& m = in.model;
  PlanShapes s;
  // Counts stay far below 2^63 for validated inputs (plan_inputs.h bounds them); the
  // products are checked anyway, so an overflow is an error, never a wrapped number.
  // Context parallel: the trainer's zigzag layout, whose widest shard is what a rank holds.
  s.tokens_per_device = I(mul(U(in.sequences), U(widest_shard(in.context, in.cp))));
  const i64 T = s.tokens_per_device;
  if (m.num_experts > 0) {
    const i64 k = m.top_k, local = m.num_experts / in.ep;
    s.routed_copies_balanced = I(mul(U(T), U(k)));
    // All EP sources route every token to this rank's experts, at most `local` copies each.
    s.routed_copies_worst = I(mul(U(in.ep), mul(U(T), U(std::min(k, local)))));
    // The busiest rank's load over the mean: the requested skew, never more than the
    // worst the layout allows.
    const double worst = static_cast<double>(s.routed_copies_worst) / static_cast<double>(std::max<i64>(s.routed_copies_balanced, 1));
    s.imbalance = in.skew <= 0 ? worst : std::min(in.skew, worst);
    s.routed_copies = std::min<i64>(static_cast<i64>(std::ceil(s.imbalance * static_cast<double>(s.routed_copies_balanced))),
                                    s.routed_copies_worst);
    const MoeShape shape{m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k};
    const DispatchSizes z = dispatch_sizes_estimate(DispatchKind::pipelined_llep, shape, static_cast<int>(in.ep), T,
                                                    s.imbalance, in.dispatch_options());
    s.round_copies = z.max_received;
    s.spilled_experts = z.foreign;
  }
  s.vocab_shard = ceil_div(m.vocab_size, in.vocab_group);
  s.boundary_bytes = mul(mul(U(T), U(m.hidden_size)), U(in.activation_bytes));
  return s;
}

namespace {

// The bytes of one phase of a term, or of its worst phase (the largest total) when
// a planner phase spans several of the term's phases (the loss spans the vocabulary
// loss's forward and backward).
ComponentBytes device_of(const Footprint& f, std::string_view phase) { return f.phase(phase).device; }

// The worst (largest total; the later of equals) of f's phases that `pick` takes by name.
template <class Pick>
ComponentBytes worst_where(const Footprint& f, const Pick& pick) {
  ComponentBytes best{};
  std::uint64_t best_total = 0;
  for (const Footprint::Phase& p : f.phases())
    if (pick(p.name) && p.device_total() >= best_total) {
      best_total = p.device_total();
      best = p.device;
    }
  return best;
}

ComponentBytes worst_phase(const Footprint& f) {
  return worst_where(f, [](std::string_view) { return true; });
}

// The worst of the named phases f has: the attention sublayer's forward is its
// projections' and its kernel's phases, its backward the projections' recomputation beside
// the kept o and lse and its own three (the shape-level MLA estimate's "forward" and
// "backward" are among them).
ComponentBytes worst_of(const Footprint& f, std::span<const std::string_view> phases) {
  return worst_where(f, [&](std::string_view n) { return std::ranges::find(phases, n) != phases.end(); });
}
constexpr std::array<std::string_view, 4> kAttentionTrainerBackwardPhases = {
    kAttentionKeptProjectPhase, kAttentionBackwardPhases[0], kAttentionBackwardPhases[1], kAttentionBackwardPhases[2]};

void add_into(ComponentBytes& to, const ComponentBytes& b) {
  for (std::size_t i = 0; i < kNumComponents; ++i) to[i] = checked_add(to[i], b[i], "a planned phase");
}

// ---- the four schedule terms ---------------------------------------------------------

Footprint vocab_term(const PlanInputs& in, const PlanShapes& s, bool ring_dtp) {
  const VocabLossShape shape = VocabLossShape::uniform(s.tokens_per_device, VocabDims{in.model.vocab_size, in.model.hidden_size},
                                                       static_cast<int>(in.vocab_group));
  VocabLossOptions o;
  o.chunk = in.vocab_chunk;
  o.keep_logits = in.keep_logits;
  const u64 a = U(in.activation_bytes);
  // Ring-DTP as the trainer runs it: the fused forward_backward in a one-rank group.
  return ring_dtp ? ring_dtp_step_footprint(shape, o, a) : materialized_vocab_footprint(shape, o, a);
}

// Expert dispatch: the dispatch's own footprint at the sizes the busiest rank sees
// (dispatch_sizes_estimate: standard EP receives the whole skewed load at once,
// PipelinedLLEP at most a round of alpha x the mean plus one spilled piece).
Footprint dispatch_term(const PlanInputs& in, const PlanShapes& s, DispatchKind kind) {
  const ModelConfig& m = in.model;
  const MoeShape shape{m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k};
  return dispatch_footprint(shape,
                            dispatch_sizes_estimate(kind, shape, static_cast<int>(in.ep), s.tokens_per_device,
                                                    s.imbalance, in.dispatch_options()),
                            U(in.activation_bytes));
}

// Checkpoint boundaries: the checkpointed stack's own footprint, resident (every
// boundary on the device) or SCO (the prefetch ring on the device, the rest on the
// host). Only its checkpoints component is taken: the residual-stream gradients it also
// holds in backward are the mlp term's stream and incoming gradient.
Footprint checkpoint_term(const PlanInputs& in, const PlanShapes& s, CheckpointSchedule schedule) {
  CheckpointOptions o;
  o.schedule = schedule;
  o.prefetch_depth = in.planned_prefetch_depth();
  if (schedule == CheckpointSchedule::sco) {
    o.resident_layers = in.resident_layers;
    o.group_layers = in.planned_checkpoint_group();
  }
  const Footprint full = checkpoint_footprint(in.model.num_layers, mul(U(s.tokens_per_device), U(in.model.hidden_size)),
                                              U(in.activation_bytes), o);
  Footprint f("checkpoints");
  f.device("step", BufferSpec{Component::checkpoints, full.device_peak(Component::checkpoints)});
  f.host("step", BufferSpec{Component::checkpoints, full.host_peak(Component::checkpoints)});
  return f;
}

// Optimizer state: the optimizer schedule's own footprint for this device's shard:
// `device` (master, m, v in the Arena) for the baseline, OffloadStreamAdamW (the state
// and two double-buffered staging buckets in host memory) when scheduled.
Footprint optimizer_term(const PlanInputs& in, u64 shard_params, std::string_view optimizer) {
  OptimizerShape shape;
  shape.n = shard_params;
  shape.param_bytes = U(in.param_bytes);
  shape.grad_bytes = U(in.grad_bytes);
  shape.master_bytes = shape.m_bytes = shape.v_bytes = U(in.optimizer_state_bytes);
  OptimizerOptions o;
  o.bucket_bytes = in.adam_bucket;
  const Footprint full = optimizer_footprint(optimizer, shape, o);
  Footprint f("optimizer");  // the steady state: the step (load's workspace is setup only)
  for (Component c : kAllComponents) {
    const auto i = static_cast<std::size_t>(c);
    f.device("step", BufferSpec{c, full.phase("step").device[i]});
    f.host("step", BufferSpec{c, full.phase("step").host[i]});
  }
  return f;
}

}  // namespace

PeakEstimate estimate_peak(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& sched) {
  const ModelConfig& m = in.model;
  const PlanShapes s = plan_shapes(in, pc);
  std::optional<std::string> why = not_a_trainer_run(in);
  if (!why) return trainer_estimate(in, s, sched);
  const u64 H = U(m.hidden_size);
  const u64 a = U(in.activation_bytes), pb = U(in.param_bytes), gb = U(in.grad_bytes);
  const bool has_moe = pc.num_moe_layers > 0;

  // ---- persistent state: shards of params, grads and optimizer --------------------
  // Routed experts: EP-sharded, then FSDP over the devices/EP replicas (so / devices);
  // everything else FSDP over the fsdp group.
  const u64 routed = U(pc.routed_experts), rest = U(pc.total) - routed;
  const u64 fs = U(in.fsdp_size()), dv = U(in.devices);
  auto shard = [&](u64 bytes_per_param) {
    return add(ceil_div_u(mul(rest, bytes_per_param), fs), ceil_div_u(mul(routed, bytes_per_param), dv));
  };
  const u64 params_shard = shard(pb), grads_shard = shard(gb), shard_params = shard(1);
  // FSDP gathers a layer's parameters (and prefetches the next); backward holds the
  // layer's unsharded gradient until its reduce-scatter.
  const bool sharded = fs > 1 || dv / U(in.ep) > 1;
  const u64 layer_params = sharded ? U(gathered_layer_params(in, pc)) : 0;
  const u64 gathered = mul(2, mul(layer_params, pb)), layer_grads = mul(layer_params, gb);
  const u64 head_params = sharded ? mul(U(s.vocab_shard), H) : 0;

  // ---- the terms: each a footprint (layers/, schedules/) ------------------------------
  const Footprint attn = attention_term(in, s, a, sched.any());
  MlpShape ms = MlpShape::of(m, s.tokens_per_device, pc.num_dense_layers > 0, has_moe);
  ms.tile = default_moe_tile(sched.dispatch());  // as model_schedules
  const Footprint mlp = mlp_footprint(ms, a);
  // The schedule set's runtime choices, as the trainer makes them (ScheduleSet's one mapping).
  const Footprint disp = has_moe ? dispatch_term(in, s, sched.dispatch()) : Footprint("dispatch");
  const Footprint vocab = vocab_term(in, s, sched.ring_dtp());
  const Footprint ckpt = checkpoint_term(in, s, sched.checkpoint());
  const Footprint opt = optimizer_term(in, shard_params, sched.optimizer());
  const ComponentBytes ckpt_dev = ckpt.device_peak();

  // ---- assemble the phases -------------------------------------------------------------
  PeakEstimate e;
  e.estimate_reason = std::move(*why);
  auto base = [&](Phase p) {
    PhaseBytes ph{p, {}};
    ph.bytes[C(Component::params)] = params_shard;
    ph.bytes[C(Component::grads)] = grads_shard;
    ph.bytes[C(Component::comm)] = in.comm_reserve;
    ph.bytes[C(Component::workspace)] = in.workspace_reserve;
    add_into(ph.bytes, opt.phase("step").device);  // the optimizer state lives through the step
    return ph;
  };
  auto with = [&](PhaseBytes ph, std::initializer_list<ComponentBytes> terms) {
    for (const ComponentBytes& t : terms) add_into(ph.bytes, t);
    return ph;
  };
  const ComponentBytes none{};
  const ComponentBytes disp_fwd = has_moe ? device_of(disp, "forward") : none;
  const ComponentBytes disp_bwd = has_moe ? device_of(disp, "backward") : none;

  // keep_attention: o and lse of every layer whose forward ran and backward has not (the
  // trainer's footprint counts the same, phase by phase).
  const ComponentBytes attn_kept = attn.has_phase("kept") ? device_of(attn, "kept") : none;
  const auto kept_layers = [&](std::int64_t n) {
    ComponentBytes b{};
    if (in.keep_attention)
      for (std::size_t i = 0; i < kNumComponents; ++i) b[i] = mul(attn_kept[i], U(std::max<std::int64_t>(n, 0)));
    return b;
  };
  const std::int64_t L = m.num_layers;
  // keep_experts: every MoE layer's kept experts (the rows the busiest device computes,
  // each row tile's store), held from its forward to the end of its backward; the last
  // layer's are not yet kept in its attention's forward and freed before its attention's
  // backward (the dense layers come first).
  ComponentBytes experts_kept{};
  if (in.keep_experts && has_moe) {
    const MoeShape shape{m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k};
    const DispatchSizes one =
        dispatch_sizes_estimate(sched.dispatch(), shape, static_cast<int>(in.ep),
                                moe_tile_rows(s.tokens_per_device, ms.tile), s.imbalance, in.dispatch_options());
    experts_kept[C(Component::dispatch)] = mul(dispatch_kept_buffer(shape, one.computed, U(in.activation_bytes)).reserved(),
                                               U(moe_tile_count(s.tokens_per_device, ms.tile)));
  }
  const auto kept_experts = [&](std::int64_t moe_layers) {
    ComponentBytes b{};
    b[C(Component::dispatch)] = mul(experts_kept[C(Component::dispatch)], U(std::max<std::int64_t>(moe_layers, 0)));
    return b;
  };
  const std::int64_t n_moe = pc.num_moe_layers;
  PhaseBytes fa = with(base(Phase::forward_attention),
                       {ckpt_dev, worst_of(attn, kAttentionForwardPhases), device_of(mlp, "residual_forward"),
                        kept_layers(L - 1), kept_experts(n_moe - 1)});
  fa.bytes[C(Component::params)] = add(fa.bytes[C(Component::params)], gathered);

  PhaseBytes fm = with(base(Phase::forward_mlp),
                       {ckpt_dev, device_of(mlp, "forward"), disp_fwd, kept_layers(L), kept_experts(n_moe)});
  fm.bytes[C(Component::params)] = add(fm.bytes[C(Component::params)], gathered);

  PhaseBytes lo = with(base(Phase::loss),
                       {ckpt_dev, device_of(mlp, "residual"), worst_phase(vocab), kept_layers(L), kept_experts(n_moe)});
  lo.bytes[C(Component::params)] = add(lo.bytes[C(Component::params)], mul(head_params, pb));
  lo.bytes[C(Component::grads)] = add(lo.bytes[C(Component::grads)], mul(head_params, gb));

  PhaseBytes ba = with(base(Phase::backward_attention),
                       {ckpt_dev, worst_of(attn, kAttentionTrainerBackwardPhases),
                        device_of(mlp, "residual_backward"), kept_layers(L - 1), kept_experts(n_moe - 1)});
  ba.bytes[C(Component::params)] = add(ba.bytes[C(Component::params)], gathered);
  ba.bytes[C(Component::grads)] = add(ba.bytes[C(Component::grads)], layer_grads);

  // The MLP's backward runs beside its attention sublayer's kept internals (the trainer's
  // forward_for_backward) where the attention term is the trainer's own footprint.
  PhaseBytes bm =
      with(base(Phase::backward_mlp),
           {ckpt_dev, device_of(mlp, "backward"), disp_bwd, attn_kept, kept_layers(L - 1), kept_experts(n_moe)});
  bm.bytes[C(Component::params)] = add(bm.bytes[C(Component::params)], gathered);
  bm.bytes[C(Component::grads)] = add(bm.bytes[C(Component::grads)], layer_grads);

  PhaseBytes op = base(Phase::optimizer);

  e.phases = {fa, fm, lo, ba, bm, op};
  for (const PhaseBytes& ph : e.phases) {
    for (std::size_t i = 0; i < kNumComponents; ++i) e.component_peak[i] = std::max(e.component_peak[i], ph.bytes[i]);
    if (ph.total() > e.peak) {
      e.peak = ph.total();
      e.binding_phase = ph.phase;
    }
  }
  const PhaseBytes& bind = e.phases[static_cast<std::size_t>(e.binding_phase)];
  std::size_t best = 0;
  for (std::size_t i = 1; i < kNumComponents; ++i)
    if (bind.bytes[i] > bind.bytes[best]) best = i;
  e.binding_component = kAllComponents[best];

  // Host memory: what the terms keep there (offloaded optimizer state with its staging
  // buckets, offloaded checkpoint boundaries).
  for (const Footprint* f : {&opt, &ckpt}) add_into(e.host, f->host_peak());
  for (std::size_t i = 0; i < kNumComponents; ++i) {
    e.host_bytes = add(e.host_bytes, e.host[i]);
    if (e.host[i] > e.host[static_cast<std::size_t>(e.host_binding_component)]) e.host_binding_component = kAllComponents[i];
  }
  e.keep_attention = in.keep_attention;
  e.keep_logits = in.keep_logits;
  e.keep_experts = in.keep_experts;
  return e;
}

}  // namespace peakbound
