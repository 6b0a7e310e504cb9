#include "peakbound/plan/plan.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

PlanInputs preset_inputs(const std::string& name, std::int64_t context) {
  PlanInputs in;
  in.model = preset_config(name);
  in.context = context;
  in.devices = 256;
  in.ep = 0;
  in.vocab_group = 0;
  in.device_memory = 141ull << 30;
  in.schedules = ScheduleSet::all();
  in.analytic = true;  // the estimate's rules (a bf16 run of a trainable preset is otherwise the trainer's footprint)
  return in;
}

TEST(Plan, ReachIsTheExactLargestContextThatFits) {
  PlanInputs in = preset_inputs("qwen3-30b-a3b", 1 << 20);
  Plan p = make_plan(in, true);
  ASSERT_TRUE(p.reach.has_value());
  for (auto [s, reach] : {std::pair{ScheduleSet::none(), p.reach->baseline}, {ScheduleSet::all(), p.reach->scheduled}}) {
    ASSERT_GT(reach, 0);
    PlanInputs x = p.inputs;
    x.context = reach;
    EXPECT_TRUE(fits_memory(x, estimate_with_policy(x, p.params, s)));
    x.context = reach + 1;
    EXPECT_FALSE(fits_memory(x, estimate_with_policy(x, p.params, s)));
  }
  EXPECT_GT(*p.reach->ratio, 1.0);
}

TEST(Plan, HostMemoryCountsInFitsAndNamesItsBindingComponent) {
  // 1M tokens a device: SCO's offloaded boundaries need ~740 GiB of host memory per
  // device, against a 256 GiB share of a 2 TiB, 8-device node.
  PlanInputs in = preset_inputs("qwen3-235b-a22b", 1 << 20);
  in.checkpoint_group = 1;  // a boundary per layer (the policy's groups would make the host fit)
  Plan p = make_plan(in, false);
  EXPECT_FALSE(p.fits_host_scheduled);
  EXPECT_FALSE(p.fits_scheduled);
  EXPECT_EQ(p.scheduled.host_binding_component, Component::checkpoints);
  EXPECT_GT(p.scheduled.host_bytes, in.host_budget());
  EXPECT_EQ(in.host_budget(), (std::uint64_t{2} << 40) / 8);
  bool cp = false;
  for (const auto& f : p.fixes) cp |= f.find("--cp") != std::string::npos;
  EXPECT_TRUE(cp) << nlohmann::json(p.fixes).dump();
  // Unlimited host memory: the same plan's host side fits.
  in.host_memory = 0;
  EXPECT_TRUE(make_plan(in, false).fits_host_scheduled);
}

TEST(Plan, SelectivePolicyKeepsBoundariesOnTheDeviceWhenTheHostBinds) {
  PlanInputs in = preset_inputs("qwen3-30b-a3b", 256 * 1024);
  in.devices = 8;
  in.host_memory = std::uint64_t{512} << 30;  // 64 GiB a device
  Plan p = make_plan(in, false);
  ASSERT_TRUE(p.policy_resident_layers.has_value());
  const std::int64_t k = *p.policy_resident_layers;
  EXPECT_GT(k, 0);
  EXPECT_TRUE(p.fits_scheduled);
  EXPECT_LE(p.scheduled.host_bytes, in.host_budget());
  // The fewest: one boundary fewer on the device and the host does not fit.
  PlanInputs fewer = p.inputs;
  fewer.resident_layers = k - 1;
  EXPECT_GT(estimate_peak(fewer, p.params, in.schedules).host_bytes, in.host_budget());
  // Given explicitly, the policy stays out of the way.
  PlanInputs fixed = p.inputs;
  fixed.resident_layers = 0;
  Plan q = make_plan(fixed, false);
  EXPECT_FALSE(q.policy_resident_layers.has_value());
  EXPECT_FALSE(q.fits_host_scheduled);
}

// SCO's ring by the device budget (prefetch_depth -1): two slots while the plan fits with
// them, one (depth 0) past that, so the reach is the one-slot ring's; a depth given is kept.
TEST(Plan, TheRingHoldsOneBoundaryWhenTwoDoNotFit) {
  PlanInputs in = preset_inputs("qwen3-30b-a3b", 1 << 20);
  in.host_memory = 0;  // the host holds every offloaded boundary: the device binds
  PlanInputs two = in, one = in;
  two.prefetch_depth = 1;
  one.prefetch_depth = 0;
  const std::int64_t reach_two = make_plan(two, true).reach->scheduled;
  const std::int64_t reach_one = make_plan(one, true).reach->scheduled;
  ASSERT_GT(reach_one, reach_two);
  EXPECT_EQ(make_plan(in, true).reach->scheduled, reach_one);
  in.context = reach_two;  // fits with two slots: the policy keeps them
  Plan p = make_plan(in, false);
  EXPECT_TRUE(p.fits_scheduled);
  EXPECT_EQ(p.prefetch_depth, 1);
  in.context = reach_two + 1;  // does not: one slot, one boundary less on the device
  Plan q = make_plan(in, false);
  EXPECT_TRUE(q.fits_scheduled);
  EXPECT_EQ(q.prefetch_depth, 0);
  EXPECT_EQ(plan_json(q)["knobs"]["prefetch_depth"], 0);
  EXPECT_NE(plan_table(q).find("SCO holds one boundary"), std::string::npos) << plan_table(q);
  two.context = in.context;
  Plan r = make_plan(two, false);
  EXPECT_FALSE(r.fits_scheduled);
  EXPECT_EQ(r.prefetch_depth, 1);
  const auto ck = static_cast<std::size_t>(Component::checkpoints);
  EXPECT_LT(q.scheduled.component_peak[ck], r.scheduled.component_peak[ck]);
}

// Checkpoint groups by the memory (checkpoint_group -1): one boundary per layer while the
// plan fits with it; where the host share binds on the boundaries, the fewest layers a
// group with which the plan fits (a group fewer does not); a group given is kept; the
// baseline keeps a boundary per layer.
TEST(Plan, CheckpointGroupsWhereTheHostBinds) {
  PlanInputs in = preset_inputs("qwen3-235b-a22b", 1 << 20);
  Plan p = make_plan(in, false);
  EXPECT_TRUE(p.fits_scheduled);
  ASSERT_GT(p.checkpoint_group, 1);
  EXPECT_EQ(plan_json(p)["knobs"]["checkpoint_group"], p.checkpoint_group);
  EXPECT_NE(plan_table(p).find("--checkpoint-group " + std::to_string(p.checkpoint_group)), std::string::npos)
      << plan_table(p);
  PlanInputs fewer = p.inputs;
  fewer.checkpoint_group = p.checkpoint_group - 1;
  Plan q = make_plan(fewer, false);
  EXPECT_FALSE(q.fits_scheduled);
  EXPECT_EQ(q.checkpoint_group, p.checkpoint_group - 1);
  EXPECT_EQ(plan_table(q).find("--checkpoint-group"), std::string::npos);
  const auto ck = static_cast<std::size_t>(Component::checkpoints);
  EXPECT_LT(p.scheduled.host_bytes, q.scheduled.host_bytes);
  EXPECT_GT(p.scheduled.component_peak[ck], q.scheduled.component_peak[ck]);  // the recomputed inputs
  EXPECT_EQ(p.baseline.peak, q.baseline.peak);
  // Where one boundary per layer fits, the policy keeps it.
  PlanInputs small = preset_inputs("qwen3-235b-a22b", 64 * 1024);
  EXPECT_EQ(make_plan(small, false).checkpoint_group, 1);
  // The reach search starts each context's groups from the fewest a smaller context needed:
  // the same reach as the policy from one layer a group (it fits there, not one token on).
  const Plan r = make_plan(in, true);
  ASSERT_TRUE(r.reach.has_value());
  PlanInputs x = r.inputs;
  x.context = r.reach->scheduled;
  std::int64_t g = 0;
  EXPECT_TRUE(fits_memory(x, estimate_with_policy(x, r.params, in.schedules, nullptr, nullptr, &g)));
  EXPECT_GT(g, 1);
  x.context += 1;
  EXPECT_FALSE(fits_memory(x, estimate_with_policy(x, r.params, in.schedules)));
  // keep_attention does not combine with groups: the policy leaves them out.
  in.keep_attention = true;
  EXPECT_EQ(make_plan(in, false).checkpoint_group, 1);
  in.keep_attention = false;
  in.checkpoint_group = 0;
  EXPECT_THROW(make_plan(in, false), InvalidArgument);
}

// The embedding by the budget (embedding "auto", train's default): the vocabulary-parallel
// one wherever the plan fits with it, the FSDP unit where only that fits, the smaller peak
// where neither does; each plan as the form given explicitly. On one device the sharded
// rows (the whole table there) and their exchange buffers raise the peak; at 4 devices with
// a vocabulary of 2^20 the FSDP embedding's whole gather and gradient bind and the sharded
// one is smaller. The reach is the larger of the two forms' reaches.
TEST(Plan, TheEmbeddingIsTheVocabularyParallelOneWhereItFits) {
  // {vocabulary, devices, vocabulary group}: with a group of 2 ranks over 1-rank vocabulary
  // groups the head's store is replicated and the FSDP embedding is the smaller; where the
  // group is every rank the store is the optimizer's shard itself and the sharded one is.
  struct Case {
    std::int64_t vocab, devices, vocab_group;
  };
  for (const Case k : {Case{16384, 2, 1}, Case{std::int64_t{1} << 20, 4, 4}}) {
    const auto [vocab, devices, vocab_group] = k;
    SCOPED_TRACE(vocab);
    PlanInputs in;
    in.model = preset_config("tiny-moe");
    in.model.vocab_size = vocab;
    in.context = 256;
    in.devices = devices;
    in.ep = devices;
    in.vocab_group = vocab_group;
    in.device_memory = 1ull << 40;
    in.host_memory = 0;
    in.schedules = ScheduleSet::all();
    PlanInputs f = in, v = in;
    f.embedding = "fsdp";
    v.embedding = "vocab";
    const Plan pf = make_plan(f, true), pv = make_plan(v, true), pa = make_plan(in, true);
    ASSERT_TRUE(pa.embedding_peaks.has_value());
    EXPECT_EQ(pa.embedding_peaks->first, pf.scheduled.peak);
    EXPECT_EQ(pa.embedding_peaks->second, pv.scheduled.peak);
    EXPECT_EQ(pa.inputs.embedding, "vocab");  // both fit
    EXPECT_EQ(pa.scheduled.peak, pv.scheduled.peak);
    EXPECT_EQ(pa.baseline.peak, pf.baseline.peak);  // the baseline's embedding is FSDP's
    EXPECT_EQ(plan_json(pa)["knobs"]["embedding"], "vocab");
    EXPECT_NE(plan_table(pa).find("--embedding vocab"), std::string::npos) << plan_table(pa);
    ASSERT_TRUE(pa.reach && pf.reach && pv.reach);
    EXPECT_EQ(pa.reach->scheduled, std::max(pf.reach->scheduled, pv.reach->scheduled));
    const bool vocab_smaller = pv.scheduled.peak < pf.scheduled.peak;
    EXPECT_EQ(vocab_smaller, vocab == (std::int64_t{1} << 20)) << pf.scheduled.peak << " vs " << pv.scheduled.peak;
    // A budget only the smaller fits: that one; one neither fits: the smaller.
    for (const std::uint64_t budget : {std::min(pf.scheduled.peak, pv.scheduled.peak), std::uint64_t{1} << 20}) {
      PlanInputs t = in;
      t.device_memory = budget;
      const Plan pt = make_plan(t, false);
      EXPECT_EQ(pt.inputs.embedding, vocab_smaller ? "vocab" : "fsdp") << budget;
    }
  }
  PlanInputs bad = preset_inputs("qwen3-30b-a3b", 4096);
  bad.embedding = "rows";
  EXPECT_THROW(make_plan(bad, false), InvalidArgument);
}

// --context-attention auto: Ulysses where the trainer's footprint with it has the smaller
// scheduled peak (or fits where the ring's does not), the ring otherwise; the baseline keeps
// the ring; the reach takes the better at each context. Heads cp cannot split, MLA and cp 1
// leave nothing to choose; a forced ulysses there is refused in one line.
TEST(Plan, TheContextAttentionIsTheSmallerOfTheTwo) {
  bool ulysses_won = false, ring_won = false;
  struct Case {
    std::int64_t heads, kv, head_dim, vocab, context;
    bool reach;
  };
  // tiny-moe (8 heads, 2 KV heads of 32) at 64K: the ring's pieces bound its buffers,
  // Ulysses holds a KV head of the whole sequence. Attention-heavy (16 heads of 128, all KV,
  // a small vocabulary) at 8K: the ring's two K/V slots of every head outweigh one head of
  // the sequence.
  for (const Case& c : {Case{8, 2, 32, 16384, 65536, false}, Case{16, 16, 128, 1024, 8192, true},
                        Case{16, 8, 128, 1024, 4096, false}}) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv) + " context " +
                 std::to_string(c.context));
    PlanInputs in;
    in.model = preset_config("tiny-moe");
    in.model.num_heads = c.heads;
    in.model.num_kv_heads = c.kv;
    in.model.head_dim = c.head_dim;
    in.model.vocab_size = c.vocab;
    in.context = c.context;
    in.devices = 4;
    in.ep = 4;
    in.vocab_group = 4;
    in.cp = 4;
    in.device_memory = 1ull << 40;
    in.host_memory = 0;
    in.comm_reserve = in.workspace_reserve = 0;
    in.schedules = ScheduleSet::all();
    PlanInputs r = in, u = in;
    r.context_attention = "ring";
    u.context_attention = "ulysses";
    const Plan pr = make_plan(r, c.reach), pu = make_plan(u, c.reach), pa = make_plan(in, c.reach);
    ASSERT_TRUE(pa.context_attention_peaks.has_value());
    EXPECT_EQ(pa.context_attention_peaks->first, pr.scheduled.peak);
    EXPECT_EQ(pa.context_attention_peaks->second, pu.scheduled.peak);
    const bool ulysses_smaller = pu.scheduled.peak < pr.scheduled.peak;
    (ulysses_smaller ? ulysses_won : ring_won) = true;
    EXPECT_EQ(pa.inputs.context_attention, ulysses_smaller ? "ulysses" : "ring");
    EXPECT_EQ(pa.scheduled.peak, std::min(pr.scheduled.peak, pu.scheduled.peak));
    EXPECT_NE(pu.scheduled.peak, pr.scheduled.peak) << "Ulysses' buffers are in the footprint";
    EXPECT_EQ(pa.baseline.peak, pr.baseline.peak);  // the baseline's attention is the ring
    EXPECT_EQ(pu.baseline.peak, pr.baseline.peak);
    if (c.reach) {
      EXPECT_EQ(pa.reach->scheduled, std::max(pr.reach->scheduled, pu.reach->scheduled));
    }
    EXPECT_EQ(plan_json(pa)["knobs"]["context_attention"], pa.inputs.context_attention);
    EXPECT_NE(plan_table(pa).find(ulysses_smaller ? "Ulysses (--context-attention ulysses" : "the ring (--context"),
              std::string::npos);
    std::printf("heads %lld/%lld of %lld at %lld, cp 4: scheduled peak ring %llu, Ulysses %llu\n",
                static_cast<long long>(c.heads), static_cast<long long>(c.kv), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.context), static_cast<unsigned long long>(pr.scheduled.peak),
                static_cast<unsigned long long>(pu.scheduled.peak));
  }
  EXPECT_TRUE(ulysses_won && ring_won) << "the cases above have each win somewhere";
  // Nothing to choose: MLA, heads 3 ranks cannot split, cp 1.
  PlanInputs mla = preset_inputs("deepseek-v3", 8192);
  mla.cp = 2;
  EXPECT_FALSE(make_plan(mla, false).context_attention_peaks.has_value());
  mla.context_attention = "ulysses";
  EXPECT_THROW(make_plan(mla, false), InvalidArgument);
  PlanInputs three;
  three.model = preset_config("tiny-moe");
  three.context = 4096;
  three.devices = three.cp = 3;
  three.device_memory = 1ull << 40;
  three.schedules = ScheduleSet::all();
  EXPECT_FALSE(make_plan(three, false).context_attention_peaks.has_value());
  three.context_attention = "ulysses";
  try {
    make_plan(three, false);
    ADD_FAILURE() << "2 KV heads, 8 query heads over 3 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cp must divide the 2 KV heads"), std::string::npos) << e.what();
  }
  three.context_attention = "heads";
  EXPECT_THROW(make_plan(three, false), InvalidArgument);
}

TEST(Plan, ReachIsZeroWhenThePersistentStateAloneDoesNotFit) {
  PlanInputs in = preset_inputs("deepseek-v3", 4096);
  in.devices = 8;
  in.device_memory = 80ull << 30;
  Plan p = make_plan(in, true);
  EXPECT_EQ(p.reach->baseline, 0);
  EXPECT_FALSE(p.reach->ratio.has_value());
  EXPECT_FALSE(p.fits_scheduled);
  ASSERT_FALSE(p.fixes.empty());
  EXPECT_NE(p.fixes.back().find("no single change"), std::string::npos) << p.fixes.back();
}

TEST(Plan, SuggestsTheScheduleThatMakesItFit) {
  // Vocabulary-bound: a huge vocabulary on a small model with a long context.
  PlanInputs in = preset_inputs("qwen3-30b-a3b", 131072);
  in.devices = 8;
  in.device_memory = 80ull << 30;
  in.schedules = ScheduleSet::parse("llep,sco,adam");
  Plan p = make_plan(in, false);
  ASSERT_FALSE(p.fits_scheduled) << "the case must not fit without dtp";
  bool dtp = false;
  for (const auto& f : p.fixes) dtp |= f.find("add dtp") != std::string::npos;
  EXPECT_TRUE(dtp) << nlohmann::json(p.fixes).dump();
}

TEST(Plan, JsonHasTheDocumentedFields) {
  Plan p = make_plan(preset_inputs("gpt-oss-120b", 1 << 20), true);
  nlohmann::json j = plan_json(p);
  for (const char* k : {"params_total", "components", "peak_bytes", "binding_component", "fits", "reach_tokens", "reach_ratio"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["components"]["vocab"].contains("baseline_bytes"));
  EXPECT_TRUE(j["components"]["vocab"].contains("scheduled_bytes"));
  EXPECT_TRUE(j["peak_bytes"].contains("baseline"));
  EXPECT_TRUE(j["fits"]["scheduled"].is_boolean());
  EXPECT_EQ(j["params_total"].get<std::int64_t>(), p.params.total);
  EXPECT_FALSE(plan_table(p).empty());
}

TEST(Plan, EveryPresetPlansWithReach) {
  for (const auto& name : preset_names()) {
    Plan p = make_plan(preset_inputs(name, 1 << 20), true);
    EXPECT_GT(p.baseline.peak, p.scheduled.peak) << name;
    ASSERT_TRUE(p.reach.has_value());
    EXPECT_GE(p.reach->scheduled, p.reach->baseline) << name;
  }
}

TEST(Plan, AutoLayout) {
  PlanInputs in = preset_inputs("mixtral-8x22b", 4096);
  Plan p = make_plan(in, false);
  EXPECT_EQ(p.inputs.ep, 8);           // 8 experts
  EXPECT_EQ(p.inputs.vocab_group, 8);
  in = preset_inputs("deepseek-v3", 4096);
  EXPECT_EQ(make_plan(in, false).inputs.ep, 64);
}

void expect_invalid(PlanInputs in, const std::string& needle) {
  try {
    make_plan(in, false);
    FAIL() << "expected InvalidArgument about " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Plan, BadInputsNameTheProblem) {
  PlanInputs in = preset_inputs("mixtral-8x22b", 4096);
  in.ep = 3;
  in.devices = 6;
  expect_invalid(in, "does not divide the 8 experts");
  in = preset_inputs("mixtral-8x22b", 4096);
  in.ep = 16;
  in.devices = 8;
  expect_invalid(in, "ep 16 must divide devices 8");
  in = preset_inputs("mixtral-8x22b", 4096);
  in.cp = 3;
  expect_invalid(in, "cp 3");
  in = preset_inputs("mixtral-8x22b", 0);
  expect_invalid(in, "context");
  in = preset_inputs("mixtral-8x22b", 4096);
  in.device_memory = 0;
  expect_invalid(in, "device_memory");
  in = preset_inputs("mixtral-8x22b", 4096);
  in.skew = 0.5;
  expect_invalid(in, "skew");
  EXPECT_THROW(ScheduleSet::parse("llep,fast"), InvalidArgument);
  EXPECT_EQ(ScheduleSet::parse("sco,llep").str(), "llep,sco");
  EXPECT_EQ(ScheduleSet::parse("llep,dtp,sco,adam").str(), "all");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
