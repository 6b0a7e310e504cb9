// The memory model against numbers computed by hand (each written out below from
// docs/plan.md's formulas), plus the properties any such model must have.
#include "peakbound/plan/memory_model.h"

#include <gtest/gtest.h>

#include "peakbound/model/param_count.h"
#include "peakbound/model/presets.h"
#include "peakbound/plan/plan.h"

namespace peakbound {
namespace {

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

TEST(MemoryModel, BaselineEveryComponentByHand) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  PeakEstimate b = estimate_peak(in, pc, ScheduleSet::none());
  // Shards over 2 devices: params 2 B, grads 4 B, optimizer 12 B per parameter.
  EXPECT_EQ(at(b, Phase::optimizer, Component::params), 277056u);
  EXPECT_EQ(at(b, Phase::optimizer, Component::grads), 554112u);
  EXPECT_EQ(at(b, Phase::optimizer, Component::optimizer), 1662336u);
  // + 2 gathered layers of 24960 params (12672 non-expert + 2 local experts x 6144) in bf16.
  EXPECT_EQ(at(b, Phase::forward_attention, Component::params), 277056u + 99840u);
  // 4 boundaries of 512 x 64 bf16.
  EXPECT_EQ(at(b, Phase::forward_attention, Component::checkpoints), 262144u);
  // 2*(T*H + q + kv + o + T*H) + 4*T*heads = 2*(5*32768) + 8192.
  EXPECT_EQ(at(b, Phase::forward_attention, Component::attention), 335872u);
  EXPECT_EQ(at(b, Phase::backward_attention, Component::attention), 671744u);
  // residual 2*T*H*2 + router logits T*E*4 + top-k ids/weights T*k*8.
  EXPECT_EQ(at(b, Phase::forward_mlp, Component::layer), 131072u + 16384u);
  // Standard EP, balanced: R = T*k = 1024 copies; 2*(T*k*H + R*H + 3*R*F + R*H + T*k*H).
  EXPECT_EQ(at(b, Phase::forward_mlp, Component::dispatch), 720896u);
  EXPECT_EQ(at(b, Phase::backward_mlp, Component::dispatch), 1114112u);
  // Megatron CE over 2 ranks, V/P = 500: 2*P*T*H*2 + P*T*Vp*6.
  EXPECT_EQ(at(b, Phase::loss, Component::vocab), 3334144u);
  EXPECT_EQ(at(b, Phase::loss, Component::params), 277056u + 64000u);
  EXPECT_EQ(at(b, Phase::loss, Component::grads), 554112u + 128000u);
  EXPECT_EQ(at(b, Phase::loss, Component::comm), 1000u);
  EXPECT_EQ(at(b, Phase::loss, Component::workspace), 3000u);
  EXPECT_EQ(total(b, Phase::forward_attention), 3326432u);
  EXPECT_EQ(total(b, Phase::forward_mlp), 3727840u);
  EXPECT_EQ(total(b, Phase::loss), 6416864u);
  EXPECT_EQ(total(b, Phase::backward_attention), 3827680u);
  EXPECT_EQ(total(b, Phase::backward_mlp), 4302816u);
  EXPECT_EQ(total(b, Phase::optimizer), 2497504u);
  EXPECT_EQ(b.peak, 6416864u);
  EXPECT_EQ(b.binding_phase, Phase::loss);
  EXPECT_EQ(b.binding_component, Component::vocab);
  EXPECT_EQ(b.host_bytes, 0u);
}

TEST(MemoryModel, ScheduledEveryComponentByHand) {
  PlanInputs in = hand_inputs();
  ParamCount pc = count_params(in.model);
  PeakEstimate s = estimate_peak(in, pc, ScheduleSet::all());
  EXPECT_EQ(at(s, Phase::optimizer, Component::optimizer), 0u);  // offloaded
  EXPECT_EQ(at(s, Phase::backward_mlp, Component::checkpoints), 131072u);  // depth 1 + current
  // PipelinedLLEP: cap 128, R = 128 + min(32,128) = 160, 2 spilled experts of 6144 params.
  EXPECT_EQ(at(s, Phase::forward_mlp, Component::dispatch), 182272u);
  EXPECT_EQ(at(s, Phase::backward_mlp, Component::dispatch), 292864u);
  // Ring-DTP: 2*64*500*4 + 2*min(32768, 32000)*2 + 12*512 + 4*512*64.
  EXPECT_EQ(at(s, Phase::loss, Component::vocab), 521216u);
  EXPECT_EQ(total(s, Phase::forward_attention), 1533024u);
  EXPECT_EQ(total(s, Phase::forward_mlp), 1395808u);
  EXPECT_EQ(total(s, Phase::loss), 1810528u);
  EXPECT_EQ(total(s, Phase::backward_attention), 2034272u);
  EXPECT_EQ(total(s, Phase::backward_mlp), 1688160u);
  EXPECT_EQ(s.peak, 2034272u);
  EXPECT_EQ(s.binding_phase, Phase::backward_attention);
  EXPECT_EQ(s.binding_component, Component::attention);
  // Host: optimizer shard + 3 staging buckets + 4 offloaded boundaries.
  EXPECT_EQ(s.host_bytes, 1662336u + 3000u + 262144u);
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
  // PipelinedLLEP's bound does not depend on skew.
  EXPECT_EQ(estimate_peak(in, pc, ScheduleSet::all()).peak, estimate_peak(hand_inputs(), pc, ScheduleSet::all()).peak);
}

TEST(MemoryModel, MonotoneInContextAndDevices) {
  PlanInputs in;
  in.model = preset_config("qwen3-30b-a3b");
  in.devices = 8;
  in.ep = 8;
  in.device_memory = 80ull << 30;
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

}  // namespace
}  // namespace peakbound
