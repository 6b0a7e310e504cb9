// The memory model against numbers computed by hand (each written out below from
// docs/plan.md's formulas), plus the properties any such model must have.
#include "peakbound/plan/memory_model.h"

#include <gtest/gtest.h>

#include "peakbound/model/param_count.h"
#include "peakbound/model/presets.h"
#include "peakbound/plan/plan.h"
#include "peakbound/schedules/optimizer_footprint.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// V=1000, H=64, 4 MoE layers, 4 experts top-2 of width 32, GQA 4 heads / 2 kv heads of 16.
ModelConfig hand_model() {
  ModelConfig m;
  m.name = "hand";
  m.family = "peakbound";
  m.vocab_size = 1000;
  m.hidden_size = 64;
  m.num_layers = 4;
  m.num_experts = 4;
  m.top_k = 2;
  m.moe_intermediate_size = 32;
  m.attention = AttentionKind::gqa;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  return m;
}

PlanInputs hand_inputs() {
  PlanInputs in;
  in.model = hand_model();
  in.context = 512;
  in.devices = 2;
  in.ep = 2;
  in.vocab_group = 2;
  in.device_memory = 1ull << 30;
  in.analytic = true;  // the estimate's rules, whether or not the trainer could run it
  in.comm_reserve = 1000;
  in.workspace_reserve = 3000;
  in.dispatch_cap = 128;
  in.llep_min_spill = 32;
  in.vocab_chunk = 64;
  in.adam_bucket = 1000;
  in.schedules = ScheduleSet::all();
  return in;
}

std::uint64_t at(const PeakEstimate& e, Phase p, Component c) {
  return e.phases[static_cast<std::size_t>(p)].bytes[static_cast<std::size_t>(c)];
}
std::uint64_t total(const PeakEstimate& e, Phase p) { return e.phases[static_cast<std::size_t>(p)].total(); }

TEST(MemoryModel, ParameterCountOfTheHandModel) {
  // embed 64000 + head 64000 + attention 4 x (4096+2048+2048+4096) + experts 4 x 4 x 6144
  // + router 4 x 256 + norms 4 x 128 + 64
  EXPECT_EQ(count_params(hand_model()).total, 277056);
  EXPECT_EQ(count_params(hand_model()).routed_experts, 98304);
}

// Every term comes from a footprint function (layers/, schedules/); the numbers below
// are those functions' values for the hand model, each worked out by hand in the
// comment beside it (docs/plan.md has the same worked example). Buffers are counted as
// the Arena reserves them (rounded up to 256 bytes).
TEST(MemoryModel, BaselineEveryComponentByHand) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  PeakEstimate b = estimate_peak(in, pc, ScheduleSet::none());
  // Shards over 2 devices: params 2 B, grads 4 B per parameter.
  EXPECT_EQ(at(b, Phase::optimizer, Component::params), 277056u);
  EXPECT_EQ(at(b, Phase::optimizer, Component::grads), 554112u);
  // optimizer_footprint("device"): master, m, v of the 138528-parameter shard, fp32 each,
  // three Arena allocations of 554112 -> 554240 bytes.
  EXPECT_EQ(at(b, Phase::optimizer, Component::optimizer), 3 * 554240u);
  EXPECT_EQ(at(b, Phase::forward_attention, Component::optimizer), 3 * 554240u);
  // + 2 gathered layers of 24960 params (12672 non-expert + 2 local experts x 6144) in bf16.
  EXPECT_EQ(at(b, Phase::forward_attention, Component::params), 277056u + 99840u);
  // resident: 4 boundaries of 512 x 64 bf16.
  EXPECT_EQ(at(b, Phase::forward_attention, Component::checkpoints), 262144u);
  // attention_layer_footprint (the trainer's sublayer, bf16): every phase holds q [512, 64],
  // k, v [512, 32] bf16 and the RoPE tables 2 x [512, 8] f32. The forward's worst phase is
  // the kernel's: + o [512, 64] bf16, lse [512, 4] f32 and the workspace, 16640 floats (the
  // projections' holds h [512, 64] bf16 and rstd [512] f32 instead, o and lse coming after
  // h is freed: 67584 bytes against 140288). The backward's worst is the kernel's: o freed,
  // lse, d_o [512, 64], row_dot [512, 4] f32, dq [512, 64], dk, dv [512, 32] and its
  // workspace with D given (2 x 128 x 128 floats).
  const std::uint64_t common = 65536u + 2 * 32768u + 2 * 16384u;
  EXPECT_EQ(at(b, Phase::forward_attention, Component::attention), common + 65536u + 8192u + 16640u * 4);
  EXPECT_EQ(at(b, Phase::backward_attention, Component::attention),
            common + 8192u + 65536u + 8192u + 65536u + 2 * 32768u + 32768u * 4);
  // mlp_footprint: stream 2 x T x H x 2 + router logits T x E x 4 + top-k ids/weights T x k x 8.
  EXPECT_EQ(at(b, Phase::forward_mlp, Component::layer), 131072u + 8192u + 8192u);
  EXPECT_EQ(at(b, Phase::backward_attention, Component::layer), 3 * 65536u);  // + the incoming gradient
  // dispatch_footprint, standard EP, balanced: 1024 copies sent and received in one round;
  // rows of H go out and come back: send, recv, back, out, x_grouped, out_grouped
  // 1024 x 64 x 2, gate/up/act 1024 x 32 x 2, and the round's i64 indices
  // (4 x 1024 + 1024 + 1) x 8 = 40968 -> 41216.
  EXPECT_EQ(at(b, Phase::forward_mlp, Component::dispatch), 6 * 131072u + 3 * 65536u + 41216u);
  // backward: rows of 2H + 1 out (x, dy, gate weight), H + 1 back (dx, d weight); + dy_grouped
  // and the grouped gate weights and their gradients 2 x 1024 x 2.
  EXPECT_EQ(at(b, Phase::backward_mlp, Component::dispatch),
            2 * 1024u * 129 * 2 + 2 * 1024u * 65 * 2 + 3 * 131072u + 3 * 65536u + 41216u + 4096u);
  // materialized_vocab_footprint, Megatron CE over P = 2 (N = 1024 gathered tokens, V/P = 500):
  // backward holds hidden [N, H] bf16, targets [N], fp32 logits [N, 500], lse [N], dHidden [N, H].
  EXPECT_EQ(at(b, Phase::loss, Component::vocab), 131072u + 4096u + 2048000u + 4096u + 131072u);
  EXPECT_EQ(at(b, Phase::loss, Component::params), 277056u + 64000u);
  EXPECT_EQ(at(b, Phase::loss, Component::grads), 554112u + 128000u);
  EXPECT_EQ(at(b, Phase::loss, Component::comm), 1000u);
  EXPECT_EQ(at(b, Phase::loss, Component::workspace), 3000u);
  EXPECT_EQ(b.binding_phase, Phase::loss);
  EXPECT_EQ(b.binding_component, Component::vocab);
  EXPECT_EQ(b.peak, 5401440u);  // docs/plan.md's worked example
  EXPECT_EQ(b.host_bytes, 0u);
}

TEST(MemoryModel, ScheduledEveryComponentByHand) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  PeakEstimate s = estimate_peak(in, pc, ScheduleSet::all());
  EXPECT_EQ(at(s, Phase::optimizer, Component::optimizer), 0u);  // offloaded
  // checkpoint_footprint, SCO at depth 1: a ring of min(D + 1, L) = 2 boundary slots.
  EXPECT_EQ(at(s, Phase::backward_mlp, Component::checkpoints), 2 * 65536u);
  // dispatch_footprint at dispatch_sizes_estimate, cap 128: 1024 copies a source -> 8 rounds
  // of 128 sent, at most 128 + EP = 130 received (balanced: nothing spills), double-buffered:
  // 2 (send 128 x 64 x 2 + recv 130 x 64 x 2 + back 128 x 64 x 2 + out 130 x 64 x 2 + the i64
  // indices (4 x 128 + 130 + 1) x 8 = 5144 -> 5376) + x_grouped and out_grouped 130 x 64 x 2
  // + gate/up/act 130 x 32 x 2 (8320 -> 8448).
  EXPECT_EQ(at(s, Phase::forward_mlp, Component::dispatch),
            2 * (16384u + 16640u + 16384u + 16640u + 5376u) + 2 * 16640u + 3 * 8448u);
  // ring_dtp_footprint, weights mode (T = 512 >= V/P = 500 rows), chunk 64, backward: lse [T]
  // fp32, a [64, 500] fp32 block, the partial dW [500, 64] bf16, and the travelling shard and
  // dW accumulator, each double-buffered.
  EXPECT_EQ(at(s, Phase::loss, Component::vocab), 2048u + 128000u + 64000u + 4 * 64000u);
  EXPECT_EQ(s.binding_phase, Phase::backward_attention);
  // The gradient shard (554112) and the gathered layer's gradient (24960 x 4) outweigh
  // the attention sublayer's backward (507904) in that phase.
  EXPECT_EQ(s.binding_component, Component::grads);
  EXPECT_EQ(s.peak, 1870432u);  // docs/plan.md's worked example
  // Host: the offloaded boundaries (L - ring = 2) and OffloadStreamAdamW's host state and
  // staging buckets (its footprint's step phase: state 12 B per parameter, staggered).
  OptimizerShape shard;
  shard.n = 138528;
  shard.param_bytes = 2;
  shard.grad_bytes = 4;
  OptimizerOptions o;
  o.bucket_bytes = 1000;
  const Footprint adam = optimizer_footprint("offload_stream", shard, o);
  EXPECT_GE(adam.phase("step").host_total(), 12u * 138528u);
  EXPECT_EQ(s.host_bytes, 2 * 65536u + adam.phase("step").host_total());
}

// --keep-attention: each layer's o [512, 4 x 16] bf16 (65536 bytes) and lse [512, 4] fp32
// (8192) held from its forward to its backward. The loss and the MLP forward hold all 4
// layers'; the attention phases and the MLP backward hold 3 beside what they held before
// (the running layer's own o and lse are already theirs).
TEST(MemoryModel, KeepAttentionAddsTheKeptBytesPerPhase) {
  PlanInputs in = hand_inputs();
  const ParamCount pc = count_params(in.model);
  const PeakEstimate plain = estimate_peak(in, pc, ScheduleSet::all());
  in.keep_attention = true;
  const PeakEstimate kept = estimate_peak(in, pc, ScheduleSet::all());
  const std::uint64_t layer = 65536u + 8192u;
  const auto grew = [&](Phase p) {
    return at(kept, p, Component::attention) - at(plain, p, Component::attention);
  };
  EXPECT_EQ(grew(Phase::loss), 4 * layer);
  EXPECT_EQ(grew(Phase::forward_mlp), 4 * layer);
  EXPECT_EQ(grew(Phase::forward_attention), 3 * layer);
  EXPECT_EQ(grew(Phase::backward_attention), 3 * layer);
  EXPECT_EQ(grew(Phase::backward_mlp), 3 * layer);
  EXPECT_EQ(grew(Phase::optimizer), 0u);
  for (Component c : kAllComponents) {
    if (c != Component::attention) {
      EXPECT_EQ(at(kept, Phase::loss, c), at(plain, Phase::loss, c));
    }
  }
  EXPECT_GT(kept.peak, plain.peak);
}

// --keep-experts: each MoE layer's experts' gate, up, act [rows, 32] and out [rows, 64]
// bf16 for the rows the busiest device computes (balanced: its 512 tokens x top-2 = 1024
// copies, one row tile), 1024 x 160 x 2 = 327680 bytes a layer under Component::dispatch,
// held from the layer's forward to the end of its backward: all 4 layers' in the MLP
// phases and the loss, 3 in the attention phases (the last layer's not yet kept in its
// forward and freed before its attention's backward).
TEST(MemoryModel, KeepExpertsAddsTheKeptRowsPerPhase) {
  PlanInputs in = hand_inputs();
  const ParamCount pc = count_params(in.model);
  const PeakEstimate plain = estimate_peak(in, pc, ScheduleSet::all());
  in.keep_experts = true;
  const PeakEstimate kept = estimate_peak(in, pc, ScheduleSet::all());
  EXPECT_TRUE(kept.keep_experts);
  const std::uint64_t layer = 1024u * 160u * 2u;
  const auto grew = [&](Phase p) { return at(kept, p, Component::dispatch) - at(plain, p, Component::dispatch); };
  EXPECT_EQ(grew(Phase::loss), 4 * layer);
  EXPECT_EQ(grew(Phase::forward_mlp), 4 * layer);
  EXPECT_EQ(grew(Phase::backward_mlp), 4 * layer);
  EXPECT_EQ(grew(Phase::forward_attention), 3 * layer);
  EXPECT_EQ(grew(Phase::backward_attention), 3 * layer);
  EXPECT_EQ(grew(Phase::optimizer), 0u);
  for (Component c : kAllComponents) {
    if (c != Component::dispatch) {
      EXPECT_EQ(at(kept, Phase::loss, c), at(plain, Phase::loss, c));
    }
  }
  EXPECT_GT(kept.peak, plain.peak);
}

TEST(MemoryModel, EveryPhaseIsTheSumOfItsTerms) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  for (ScheduleSet sched : {ScheduleSet::none(), ScheduleSet::all()}) {
    PeakEstimate e = estimate_peak(in, pc, sched);
    std::uint64_t peak = 0;
    for (Phase p : {Phase::forward_attention, Phase::forward_mlp, Phase::loss, Phase::backward_attention,
                    Phase::backward_mlp, Phase::optimizer}) {
      std::uint64_t sum = 0;
      for (Component c : kAllComponents) sum += at(e, p, c);
      EXPECT_EQ(total(e, p), sum);
      peak = std::max(peak, sum);
    }
    EXPECT_EQ(e.peak, peak);
  }
}

TEST(MemoryModel, PeakIsTheMaxOverPhasesNotTheSumOfComponentPeaks) {
  PlanInputs in = hand_inputs();
  PeakEstimate b = estimate_peak(in, count_params(in.model), ScheduleSet::none());
  std::uint64_t sum = 0;
  for (auto v : b.component_peak) sum += v;
  EXPECT_LT(b.peak, sum);
}

TEST(MemoryModel, WorstSkewSendsEverythingToOneRank) {
  PlanInputs in = hand_inputs();
  in.skew = 0;  // worst
  ParamCount pc = count_params(in.model);
  PlanShapes s = plan_shapes(in, pc);
  EXPECT_EQ(s.routed_copies, 2 * 512 * 2);  // EP x T x min(k, E/EP)
  EXPECT_GT(estimate_peak(in, pc, ScheduleSet::none()).component_peak[static_cast<std::size_t>(Component::dispatch)],
            estimate_peak(hand_inputs(), pc, ScheduleSet::none()).component_peak[static_cast<std::size_t>(Component::dispatch)]);
  // PipelinedLLEP's rounds hold alpha x the mean plus one spilled piece whatever the skew:
  // far below the baseline's everything-at-once at the worst skew.
  const auto D = static_cast<std::size_t>(Component::dispatch);
  const std::uint64_t base_worst = estimate_peak(in, pc, ScheduleSet::none()).component_peak[D];
  const std::uint64_t llep_worst = estimate_peak(in, pc, ScheduleSet::all()).component_peak[D];
  EXPECT_LT(2 * llep_worst, base_worst);
}

TEST(MemoryModel, MonotoneInContextAndDevices) {
  PlanInputs in;
  in.model = preset_config("qwen3-30b-a3b");
  in.devices = 8;
  in.ep = 8;
  in.device_memory = 80ull << 30;
  in.analytic = true;  // the estimate's monotonicity (the trainer's footprint: plan_trainer_test)
  ParamCount pc = count_params(in.model);
  for (ScheduleSet s : {ScheduleSet::none(), ScheduleSet::all()}) {
    std::uint64_t prev = 0;
    for (std::int64_t ctx = 1024; ctx <= (1 << 20); ctx *= 2) {
      in.context = ctx;
      std::uint64_t p = estimate_peak(in, pc, s).peak;
      EXPECT_GT(p, prev) << ctx;
      prev = p;
    }
    in.context = 65536;
    std::uint64_t last = ~0ull;
    for (std::int64_t d : {8, 16, 32, 64}) {
      in.devices = d;
      in.cp = d / 8;
      std::uint64_t p = estimate_peak(in, pc, s).peak;
      EXPECT_LT(p, last) << d;
      last = p;
    }
    in.devices = 8;
    in.cp = 1;
  }
}

TEST(MemoryModel, EachScheduleLowersOnlyItsOwnComponent) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  PeakEstimate none = estimate_peak(in, pc, ScheduleSet::none());
  const std::pair<ScheduleSet, Component> cases[] = {
      {ScheduleSet::parse("llep"), Component::dispatch},
      {ScheduleSet::parse("dtp"), Component::vocab},
      {ScheduleSet::parse("sco"), Component::checkpoints},
      {ScheduleSet::parse("adam"), Component::optimizer}};
  for (auto [s, comp] : cases) {
    PeakEstimate e = estimate_peak(in, pc, s);
    for (Component c : kAllComponents) {
      auto i = static_cast<std::size_t>(c);
      if (c == comp) EXPECT_LT(e.component_peak[i], none.component_peak[i]) << s.str();
      else EXPECT_EQ(e.component_peak[i], none.component_peak[i]) << s.str() << " " << component_name(c);
    }
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
