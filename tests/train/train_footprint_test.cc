// train_footprint on one rank: after one Trainer::step the Arena's (and HostMemory's)
// measured peaks equal the footprint per component and in total, schedules none and
// all, and SCO with boundaries offloaded to the host; the phases and the argument
// checks.
#include "peakbound/train/fsdp_units.h"
#include "peakbound/plan/trainer_plan.h"
#include "peakbound/train/train_footprint.h"

#include <array>
#include <cstdio>
#include <utility>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "tests/train/train_footprint_check.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using namespace train_footprint_check;

TEST(TrainFootprint, MeasuredEqualsFootprintNone) {
  SingleRankCommunicator world;
  check(world, kNone, tiny_model());
}

TEST(TrainFootprint, MeasuredEqualsFootprintAll) {
  SingleRankCommunicator world;
  check(world, kAll, tiny_model());
}

// Six layers, the last one resident: three ring slots and two boundaries on the host.
TEST(TrainFootprint, MeasuredEqualsFootprintScoOffloaded) {
  SingleRankCommunicator world;
  CheckpointOptions o;
  o.resident_layers = 1;
  check(world, kAll, tiny_model(6), &o);
  const Measured m = run_step(world, kAll, tiny_model(6), 2, 24, &o);
  EXPECT_GT(m.host[static_cast<std::size_t>(Component::checkpoints)], 0u);
}

// keep_attention: every layer's attention output and log-sum-exp held from its forward to
// its backward; measured == footprint with the resident and the offloaded stack, f32 and
// bf16, and the kept bytes add to the peak.
TEST(TrainFootprint, MeasuredEqualsFootprintAttentionKept) {
  SingleRankCommunicator world;
  check(world, kNoneKept, tiny_model());
  check(world, kAllKept, tiny_model());
  CheckpointOptions o;
  o.resident_layers = 1;
  check(world, kAllKept, tiny_model(6), &o);
  check(world, kAllKept, tiny_model(6), &o, {}, 1, 24, Precision::bf16);
  const Measured plain = run_step(world, kAll, tiny_model(6), 2, 24, &o);
  const Measured kept = run_step(world, kAllKept, tiny_model(6), 2, 24, &o);
  EXPECT_GT(kept.device[static_cast<std::size_t>(Component::attention)],
            plain.device[static_cast<std::size_t>(Component::attention)]);
}

// keep_experts: every MoE layer's experts' gate, up, act and out held from its forward to
// the end of its backward (one store per row tile); measured == footprint resident and
// offloaded, f32 and bf16, in checkpoint groups (whose recomputation keeps nothing new),
// and the kept rows add to the dispatch's peak.
TEST(TrainFootprint, MeasuredEqualsFootprintExpertsKept) {
  SingleRankCommunicator world;
  check(world, kNoneKeptExperts, tiny_model());
  check(world, kAllKeptExperts, tiny_model());
  CheckpointOptions o;
  o.resident_layers = 1;
  check(world, kAllKeptExperts, tiny_model(6), &o, {}, 1, 24, Precision::bf16);
  CheckpointOptions g;
  g.group_layers = 2;
  Variant grouped = kNoneKeptExperts;
  grouped.name = "none, experts kept, groups of 2";
  check(world, grouped, tiny_model(6), &g);
  const Measured plain = run_step(world, kNone, tiny_model(6), 2, 24);
  const Measured kept = run_step(world, kNoneKeptExperts, tiny_model(6), 2, 24);
  EXPECT_GT(kept.device[static_cast<std::size_t>(Component::dispatch)],
            plain.device[static_cast<std::size_t>(Component::dispatch)]);
}

// Checkpoint groups (CheckpointOptions::group_layers): one boundary per group of G layers,
// the group's other inputs recomputed in its backward into buffers held beside the
// boundaries until their layer's backward is done (the recomputation's attention and MLP
// phases); measured == footprint with both schedules, SCO's one-slot ring, the attention
// in pieces and bf16, and fewer boundaries on the host.
TEST(TrainFootprint, MeasuredEqualsFootprintCheckpointGroups) {
  SingleRankCommunicator world;
  for (const std::int64_t G : {2, 3, 4, 6}) {
    SCOPED_TRACE("groups of " + std::to_string(G));
    CheckpointOptions o;
    o.group_layers = G;
    check(world, kNone, tiny_model(6), &o);
    o.resident_layers = 1;
    check(world, kAll, tiny_model(6), &o);
    check(world, kAllPieces, tiny_model(6), &o, {}, 1, 24, Precision::bf16);
    o.resident_layers.reset();
    o.prefetch_depth = 0;
    check(world, kAllPieces, tiny_model(6), &o);
  }
  CheckpointOptions one, two;
  one.resident_layers = two.resident_layers = 0;
  two.group_layers = 2;
  const Measured a = run_step(world, kAll, tiny_model(6), 2, 24, &one);
  const Measured b = run_step(world, kAll, tiny_model(6), 2, 24, &two);
  const auto cp = static_cast<std::size_t>(Component::checkpoints);
  EXPECT_LT(b.host[cp], a.host[cp]);  // 1 boundary of 3 on the host against 4 of 6
  EXPECT_TRUE(b.footprint.has_phase("recompute attention"));
  EXPECT_TRUE(b.footprint_max.has_phase("recompute mlp"));  // (footprint: per MoE layer, "... (layer 4)")
  EXPECT_FALSE(a.footprint.has_phase("recompute attention"));
}

// The vocabulary-parallel embedding on a model whose hidden is wide beside its vocabulary,
// so that its exchange buffers (in one round of every token) are the vocabulary component's
// peak: measured == footprint, and that peak sits in the embedding's forward or backward.
TEST(TrainFootprint, MeasuredEqualsFootprintVocabEmbedding) {
  SingleRankCommunicator world;
  ModelConfig c = tiny_model();
  c.vocab_size = 40;
  c.hidden_size = 64;
  check(world, kAllVocabEmbedding, c);
  Variant whole = kAllVocabEmbedding;
  whole.embedding_rows = 1 << 20;  // one round of every token
  check(world, whole, c, nullptr, {}, 1, 24, Precision::bf16);
  const Measured m = run_step(world, whole, c);
  const auto v = static_cast<std::size_t>(Component::vocab);
  const std::uint64_t fwd = m.footprint.phase("embedding forward").device[v];
  const std::uint64_t bwd = m.footprint.phase("embedding backward").device[v];
  EXPECT_EQ(std::max(fwd, bwd), m.device[v]);
  EXPECT_GT(fwd, 0u);
}

TrainFootprintInputs inputs() {
  TrainFootprintInputs in;
  in.model = tiny_model();
  in.sequences = 2;
  in.seq_len = 24;
  return in;
}

// Each phase of the trainer's footprint lands in the planner's phase its name says (the
// attention sublayer's several moments in its forward or backward attention phase).
TEST(TrainFootprint, PhasesMapToThePlannersPhases) {
  TrainFootprintInputs one_slot = inputs();  // SCO's one-slot ring: the final norm's forward is a phase too
  one_slot.schedules.checkpoint.schedule = CheckpointSchedule::sco;
  one_slot.schedules.checkpoint.prefetch_depth = 0;
  ASSERT_TRUE(train_footprint(one_slot).has_phase("final norm forward"));
  TrainFootprintInputs grouped = inputs();  // checkpoint groups: their recomputation's phases
  grouped.schedules.checkpoint.group_layers = 2;
  ASSERT_TRUE(train_footprint(grouped).has_phase("recompute attention"));
  ASSERT_TRUE(train_footprint(grouped).has_phase("recompute mlp"));
  for (const Footprint& f : {train_footprint(inputs()), train_footprint(one_slot), train_footprint(grouped)}) {
    for (const Footprint::Phase& p : f.phases()) {
      const std::string& n = p.name;
      const Phase want = n.starts_with("forward attention") || n == "embedding forward" ? Phase::forward_attention
                         : n.starts_with("forward ")                                      ? Phase::forward_mlp
                         : n.starts_with("backward attention") || n == "embedding backward"
                             ? Phase::backward_attention
                         : n.starts_with("backward ")           ? Phase::backward_mlp
                         : n.starts_with("recompute attention") ? Phase::backward_attention
                         : n.starts_with("recompute ")          ? Phase::backward_mlp
                         : n.starts_with("optimizer") ? Phase::optimizer
                                                      : Phase::loss;
      EXPECT_EQ(planner_phase_of(n), want) << n;
    }
  }
}

TEST(TrainFootprint, PhasesAndEstimate) {
  const Footprint f = train_footprint(inputs());
  for (const char* p : {"optimizer load", "embedding forward", "forward attention project", "forward attention",
                        "forward dense mlp", "forward mlp", "loss forward", "embedding backward", "loss backward",
                        "final norm backward", "backward mlp", "backward dense mlp",
                        "backward attention recompute project", "backward attention recompute",
                        "backward attention output", "backward attention", "backward attention project",
                        "optimizer"})
    EXPECT_TRUE(f.has_phase(p)) << p;
  // The persistent buffers are in every phase; under FSDP the embedding and the final
  // norm are gathered (parameters) only in their own phases.
  const std::uint64_t persistent = f.phase("optimizer").device[static_cast<std::size_t>(Component::params)];
  const FsdpBuffers fb = fsdp_buffers(TensorTable(inputs().model), inputs().world);
  for (const Footprint::Phase& p : f.phases()) {
    const std::uint64_t params = p.device[static_cast<std::size_t>(Component::params)];
    const std::uint64_t gathered = p.name == "embedding forward" ? fb.embed_params.reserved()
                                   : p.name.rfind("loss", 0) == 0 || p.name.rfind("final norm", 0) == 0
                                       ? fb.norm_params.reserved()
                                       : 0;
    EXPECT_EQ(params, persistent + gathered) << p.name;
    EXPECT_EQ(p.device[static_cast<std::size_t>(Component::optimizer)], f.device_peak(Component::optimizer))
        << p.name;
  }
  // Unset dispatch: the estimate sizes the routed experts' buffers; more skew, more memory.
  TrainFootprintInputs skewed = inputs();
  skewed.skew = 4.0;
  EXPECT_GT(f.device_peak(Component::dispatch), 0u);
  EXPECT_GE(train_footprint(skewed).device_peak(Component::dispatch), f.device_peak(Component::dispatch));
  // No tokens: no stack, no activations, the persistent state only (and the dispatch's receive side).
  TrainFootprintInputs none = inputs();
  none.sequences = 0;
  const Footprint z = train_footprint(none);
  EXPECT_EQ(z.device_peak(Component::checkpoints), 0u);
  EXPECT_EQ(z.device_peak(Component::layer), 0u);
}

// ---- f32 pinned: the totals train_footprint gave before the bf16 form (read from the
// code at 22de779), so the precision refactor provably leaves every f32 phase and
// component byte-identical. Configurations: the tiny model at one rank (none, all,
// SCO with four of six boundaries offloaded, the held-out loss), and rank 1 of 2 and
// rank 3 of 4 (cp 2 on a length its chunks split unevenly; ranks without tokens; the
// dispatch estimate at skew 2).
struct PinConfig {
  const char* name;
  TrainFootprintInputs in;
};
std::vector<PinConfig> pin_configs(Precision p) {
  auto make = [p](const Variant& v, std::int64_t layers, int world, int rank, int cp, std::int64_t seq_len) {
    TrainFootprintInputs in;
    in.model = tiny_model(layers);
    in.world = world;
    in.rank = rank;
    in.layout.cp = cp;
    in.layout.ep = world;
    in.layout.vocab = world;
    in.sequences = 2;
    in.seq_len = seq_len;
    in.schedules.dispatch = v.dispatch;
    in.schedules.ring_dtp = v.ring_dtp;
    in.schedules.checkpoint.schedule = v.checkpoint;
    in.schedules.precision = p;
    in.optimizer = v.optimizer;
    return in;
  };
  std::vector<PinConfig> out;
  out.push_back({"none", make(kNone, 3, 1, 0, 1, 24)});
  out.push_back({"all", make(kAll, 3, 1, 0, 1, 24)});
  out.push_back({"all sco offloaded, eval", make(kAll, 6, 1, 0, 1, 24)});
  out.back().in.schedules.checkpoint.resident_layers = 1;
  out.back().in.evaluates = true;
  out.push_back({"none cp 2 rank 1 of 2", make(kNone, 3, 2, 1, 2, 27)});
  out.push_back({"all cp 2 rank 1 of 2, eval", make(kAll, 3, 2, 1, 2, 27)});
  out.back().in.evaluates = true;
  out.push_back({"all rank 3 of 4, uneven, skew 2", make(kAll, 3, 4, 3, 1, 24)});
  out.back().in.rank_sequences = {2, 0, 2, 1};
  out.back().in.skew = 2.0;
  out.push_back({"none rank 2 of 4, no tokens", make(kNone, 3, 4, 2, 1, 24)});
  out.back().in.rank_sequences = {2, 1, 0, 2};
  return out;
}

// FNV-1a over every phase's name and per-component device and host bytes, in order.
std::uint64_t digest(const Footprint& f) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto byte = [&h](unsigned char b) { h = (h ^ b) * 0x100000001b3ull; };
  auto word = [&byte](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
  };
  for (const Footprint::Phase& p : f.phases()) {
    for (char ch : p.name) byte(static_cast<unsigned char>(ch));
    for (std::size_t c = 0; c < kNumComponents; ++c) {
      word(p.device[c]);
      word(p.host[c]);
    }
  }
  return h;
}

struct Pinned {
  std::uint64_t digest;
  std::array<std::uint64_t, kNumComponents> device_peak;
  std::uint64_t host_peak;
  std::vector<std::pair<std::string, std::uint64_t>> phase_device;  // every phase's device total
};

void print_pinned(const char* name, const Footprint& f) {
  std::printf("    // %s\n    {0x%016llxull,\n     {", name, static_cast<unsigned long long>(digest(f)));
  for (Component c : kAllComponents) std::printf("%llu, ", static_cast<unsigned long long>(f.device_peak(c)));
  std::printf("},\n     %llu,\n     {", static_cast<unsigned long long>(f.host_peak_total()));
  for (const Footprint::Phase& p : f.phases())
    std::printf("{\"%s\", %llu}, ", p.name.c_str(), static_cast<unsigned long long>(p.device_total()));
  std::printf("}},\n");
}

TEST(TrainFootprint, F32TotalsPinned) {
  const std::vector<PinConfig> configs = pin_configs(Precision::f32);
  // {digest, device peak per component (kAllComponents order), host peak, each phase's device total}
  const std::vector<Pinned> pinned = {
    // none
    {0x2e685694f7bd144aull,
     {722176, 722176, 1679616, 18432, 191232, 70400, 164352, 98560, 61952, 1536},
     559872,
     {{"optimizer load", 3110144}, {"embedding forward", 3155200}, {"forward attention project", 3154944},
       {"forward attention", 3222016}, {"forward dense mlp", 3184640}, {"forward mlp", 3301888},
       {"loss forward", 3206656}, {"loss backward", 3218432}, {"final norm backward", 3148288},
       {"backward mlp", 3355136}, {"backward dense mlp", 3222272}, {"backward attention recompute project", 3154944},
       {"backward attention recompute", 3222016}, {"backward attention reproject", 3161856},
       {"backward attention output", 3162368}, {"backward attention", 3299584},
       {"backward attention project", 3167232}, {"embedding backward", 3155200}, {"optimizer", 3110144}}},
    // all
    {0x16346a4e76771262ull,
     {722176, 722176, 0, 12288, 191232, 57600, 164352, 98560, 61952, 1536},
     4500736,
     {{"optimizer load", 1430528}, {"embedding forward", 1481728}, {"forward attention project", 1469184},
       {"forward attention", 1536256}, {"forward dense mlp", 1505024}, {"forward mlp", 1616128},
       {"loss forward", 1519872}, {"loss backward", 1519872}, {"final norm backward", 1462528},
       {"backward mlp", 1669376}, {"backward dense mlp", 1548800}, {"backward attention recompute project", 1469184},
       {"backward attention recompute", 1536256}, {"backward attention reproject", 1476096},
       {"backward attention output", 1476608}, {"backward attention", 1613824},
       {"backward attention project", 1481472}, {"embedding backward", 1487872}, {"optimizer", 1442816}}},
    // all sco offloaded, eval
    {0x65436f368023d1e6ull,
     {1353472, 1353472, 0, 18432, 191232, 58624, 164352, 98560, 61952, 1536},
     9551104,
     {{"optimizer load", 2693120}, {"embedding forward", 2744320}, {"forward attention project", 2737920},
       {"forward attention", 2804992}, {"forward dense mlp", 2767616}, {"forward mlp", 2884864},
       {"loss forward", 2788608}, {"loss backward", 2788608}, {"loss eval", 2777088},
       {"final norm backward", 2731264}, {"backward mlp", 2938112}, {"backward dense mlp", 2811392},
       {"backward attention recompute project", 2737920}, {"backward attention recompute", 2804992},
       {"backward attention reproject", 2744832}, {"backward attention output", 2745344},
       {"backward attention", 2882560}, {"backward attention project", 2750208}, {"embedding backward", 2750464},
       {"optimizer", 2705408}}},
    // none cp 2 rank 1 of 2
    {0x215eac512720062dull,
     {442368, 442368, 840192, 10752, 111360, 46848, 159488, 57600, 30976, 1536},
     280064,
     {{"optimizer load", 1680128}, {"embedding forward", 1722624}, {"forward attention project", 1706496},
       {"forward attention", 1776896}, {"forward dense mlp", 1723904}, {"forward mlp", 1792256},
       {"loss forward", 1739776}, {"loss backward", 1749760}, {"final norm backward", 1703424},
       {"backward mlp", 1823232}, {"backward dense mlp", 1745920}, {"backward attention recompute project", 1706496},
       {"backward attention recompute", 1776896}, {"backward attention reproject", 1710592},
       {"backward attention output", 1710848}, {"backward attention", 1854464},
       {"backward attention project", 1713664}, {"embedding backward", 1722624}, {"optimizer", 1680128}}},
    // all cp 2 rank 1 of 2, eval
    {0x2817487109a76a6aull,
     {442368, 442368, 0, 7168, 111360, 36096, 159488, 57600, 30976, 1536},
     2262272,
     {{"optimizer load", 839936}, {"embedding forward", 886016}, {"forward attention project", 862720},
       {"forward attention", 933120}, {"forward dense mlp", 883712}, {"forward mlp", 948480},
       {"loss forward", 881920}, {"loss backward", 895232}, {"loss eval", 881408}, {"final norm backward", 859648},
       {"backward mlp", 979456}, {"backward dense mlp", 909312}, {"backward attention recompute project", 862720},
       {"backward attention recompute", 933120}, {"backward attention reproject", 866816},
       {"backward attention output", 867072}, {"backward attention", 1010688}, {"backward attention project", 869888},
       {"embedding backward", 889600}, {"optimizer", 847104}}},
    // all rank 3 of 4, uneven, skew 2
    {0x05eef27abdeda2b5ull,
     {304640, 304640, 0, 6144, 684288, 46592, 148480, 49408, 15616, 1536},
     1148160,
     {{"optimizer load", 548096}, {"embedding forward", 593664}, {"forward attention project", 568320},
       {"forward attention", 635136}, {"forward dense mlp", 585728}, {"forward mlp", 946944},
       {"loss forward", 592128}, {"loss backward", 611840}, {"final norm backward", 566272},
       {"backward mlp", 1256704}, {"backward dense mlp", 607744}, {"backward attention recompute project", 568320},
       {"backward attention recompute", 635136}, {"backward attention reproject", 571904},
       {"backward attention output", 572160}, {"backward attention", 706304}, {"backward attention project", 574464},
       {"embedding backward", 596736}, {"optimizer", 554240}}},
    // none rank 2 of 4, no tokens
    {0xda633a0f2ce9923bull,
     {304640, 304640, 422400, 0, 191232, 67840, 0, 0, 15616, 1024},
     140800,
     {{"optimizer load", 970496}, {"embedding forward", 1009408}, {"forward attention project", 970496},
       {"forward attention", 970496}, {"forward dense mlp", 970496}, {"forward mlp", 1122048},
       {"loss forward", 1025024}, {"loss backward", 1039360}, {"final norm backward", 972544},
       {"backward mlp", 1161728}, {"backward dense mlp", 970496}, {"backward attention recompute project", 970496},
       {"backward attention recompute", 970496}, {"backward attention reproject", 970496},
       {"backward attention output", 970496}, {"backward attention", 970496}, {"backward attention project", 970496},
       {"embedding backward", 1009408}, {"optimizer", 970496}}},
  };
  ASSERT_EQ(pinned.size(), configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE(configs[i].name);
    const Footprint f = train_footprint(configs[i].in);
    const Pinned& want = pinned[i];
    for (Component c : kAllComponents)
      EXPECT_EQ(f.device_peak(c), want.device_peak[static_cast<std::size_t>(c)]) << component_name(c);
    EXPECT_EQ(f.host_peak_total(), want.host_peak);
    if (f.phases().size() != want.phase_device.size()) {
      ADD_FAILURE() << f.phases().size() << " phases, " << want.phase_device.size() << " pinned";
      print_pinned(configs[i].name, f);  // the new pin
      continue;
    }
    for (std::size_t k = 0; k < want.phase_device.size(); ++k) {
      EXPECT_EQ(f.phases()[k].name, want.phase_device[k].first);
      EXPECT_EQ(f.phases()[k].device_total(), want.phase_device[k].second) << want.phase_device[k].first;
    }
    EXPECT_EQ(digest(f), want.digest) << "a phase's per-component device or host bytes changed";
    if (::testing::Test::HasFailure()) print_pinned(configs[i].name, f);
  }
}

// bf16 (ModelSchedules::precision): one step of the bf16 model, measured == footprint per
// component and phase-peak, as the f32 tests above.
TEST(TrainFootprint, MeasuredEqualsFootprintBf16None) {
  SingleRankCommunicator world;
  check(world, kNone, tiny_model(), nullptr, {}, 1, 24, Precision::bf16);
}

TEST(TrainFootprint, MeasuredEqualsFootprintBf16All) {
  SingleRankCommunicator world;
  check(world, kAll, tiny_model(), nullptr, {}, 1, 24, Precision::bf16);
}

TEST(TrainFootprint, MeasuredEqualsFootprintBf16ScoOffloaded) {
  SingleRankCommunicator world;
  CheckpointOptions o;
  o.resident_layers = 1;
  check(world, kAll, tiny_model(6), &o, {}, 1, 24, Precision::bf16);
  // Odd T (a single sequence of 37 tokens): [T, H] bf16 rows not a multiple of the alignment.
  const Measured m = run_step(world, kAll, tiny_model(6), 1, 37, &o, {}, 1, Precision::bf16);
  for (Component c : kAllComponents) {
    EXPECT_EQ(m.device[static_cast<std::size_t>(c)], m.footprint.device_peak(c)) << component_name(c);
    EXPECT_EQ(m.host[static_cast<std::size_t>(c)], m.footprint.host_peak(c)) << component_name(c);
  }
}

// bf16 against f32 on the same inputs. Shrink: the parameters the model computes with
// (FSDP shard and slots, the stores' params, the trainer's param shard: 2 bytes instead
// of 4, up to the Arena's 256-byte rounding per buffer), the checkpoint boundaries
// (device and host), the layers' activations and the dispatch's rows, the host staging
// of parameters. Unchanged: every gradient (f32 in both), the optimizer's device state
// (fp32 master, m, v), the reduce scratch and workspace (comm, workspace). Attention
// carries fp32 tiles under bf16 (o32/dq32 [min(S, 256), Q], dkv32 [S, 2K]): at the tiny
// model (H 32, T 48) they outweigh the halved activations and attention grows; at a
// realistic shape (H 256, 2 x 1024 tokens) it shrinks. The vocabulary loss does not
// shrink: its logits / blocks are fp32 in both precisions and bf16 adds the narrowed
// gradient tile g16 (and d_hidden32 [T, H] fp32); it measures 0.93x-1.56x of f32 at
// the realistic shape (1.56x: the fused P = 1 block gets a bf16 copy of itself).
void expect_bf16_smaller(const TrainFootprintInputs& bf16_in, bool attention_shrinks) {
  TrainFootprintInputs f32_in = bf16_in;
  f32_in.schedules.precision = Precision::f32;
  const Footprint a = train_footprint(f32_in), b = train_footprint(bf16_in);
  auto dev = [](const Footprint& f, Component c) { return f.device_peak(c); };
  auto halved = [](std::uint64_t f32, std::uint64_t bf) {
    // 256 bytes of rounding for each of the at most 16 buffers a component holds at once
    return 2 * bf >= f32 && bf <= f32 / 2 + 16 * 256;
  };
  EXPECT_TRUE(halved(dev(a, Component::params), dev(b, Component::params)))
      << dev(a, Component::params) << " -> " << dev(b, Component::params);
  EXPECT_TRUE(halved(dev(a, Component::checkpoints), dev(b, Component::checkpoints)));
  EXPECT_TRUE(halved(a.host_peak(Component::checkpoints), b.host_peak(Component::checkpoints)));
  for (Component c : {Component::grads, Component::optimizer, Component::comm, Component::workspace})
    EXPECT_EQ(dev(a, c), dev(b, c)) << component_name(c);
  std::vector<Component> shrink = {Component::layer, Component::dispatch};
  if (attention_shrinks) shrink.push_back(Component::attention);
  for (Component c : shrink) {
    EXPECT_LE(dev(b, c), dev(a, c)) << component_name(c);
    if (dev(a, c) > 0) {
      EXPECT_LT(dev(b, c), dev(a, c)) << component_name(c);
    }
  }
  EXPECT_LT(b.device_peak_total(), a.device_peak_total());
  if (a.host_peak_total() > 0) {
    EXPECT_LT(b.host_peak_total(), a.host_peak_total());
  }
  // Phase by phase: the same phases, gradients and optimizer state byte-equal.
  ASSERT_EQ(a.phases().size(), b.phases().size());
  for (std::size_t k = 0; k < a.phases().size(); ++k) {
    const Footprint::Phase &pa = a.phases()[k], &pb = b.phases()[k];
    EXPECT_EQ(pa.name, pb.name);
    for (Component c : {Component::grads, Component::optimizer})
      EXPECT_EQ(pa.device[static_cast<std::size_t>(c)], pb.device[static_cast<std::size_t>(c)])
          << pa.name << " " << component_name(c);
    EXPECT_LT(pb.device_total(), pa.device_total()) << pa.name;
  }
}

TEST(TrainFootprint, Bf16SmallerThanF32) {
  for (const PinConfig& pc : pin_configs(Precision::bf16)) {
    SCOPED_TRACE(pc.name);
    expect_bf16_smaller(pc.in, /*attention_shrinks=*/false);
  }
  // The tiny model's attention grows under bf16 (its fp32 tiles).
  TrainFootprintInputs in = inputs();
  in.schedules.precision = Precision::bf16;
  const Footprint b = train_footprint(in);
  EXPECT_GT(b.device_peak(Component::attention), train_footprint(inputs()).device_peak(Component::attention));
}

// A model of realistic proportions (the tiny model's layout at H 256, head_dim 64, V 4096,
// 2 x 1024 tokens): every activation-carrying component but the vocabulary loss shrinks.
TEST(TrainFootprint, Bf16SmallerThanF32AtRealisticShape) {
  for (const PinConfig& pc : pin_configs(Precision::bf16)) {
    SCOPED_TRACE(pc.name);
    TrainFootprintInputs in = pc.in;
    in.model.hidden_size = 256;
    in.model.head_dim = 64;
    in.model.vocab_size = 4096;
    in.model.dense_intermediate_size = 4 * 256;
    in.model.moe_intermediate_size = 2 * 256;
    in.seq_len = in.seq_len * 1024 / 24;
    if (in.layout.cp > 1) in.seq_len += 1;  // uneven zigzag chunks, as the pinned cp configs
    expect_bf16_smaller(in, /*attention_shrinks=*/true);
    const Footprint a = train_footprint([&] {
      TrainFootprintInputs f = in;
      f.schedules.precision = Precision::f32;
      return f;
    }()), b = train_footprint(in);
    std::printf("%-32s device peak f32 %10llu bf16 %10llu (%.3f); attention %.3f, vocab %.3f, layer %.3f\n", pc.name,
                static_cast<unsigned long long>(a.device_peak_total()),
                static_cast<unsigned long long>(b.device_peak_total()),
                static_cast<double>(b.device_peak_total()) / static_cast<double>(a.device_peak_total()),
                static_cast<double>(b.device_peak(Component::attention)) /
                    static_cast<double>(std::max<std::uint64_t>(1, a.device_peak(Component::attention))),
                static_cast<double>(b.device_peak(Component::vocab)) /
                    static_cast<double>(std::max<std::uint64_t>(1, a.device_peak(Component::vocab))),
                static_cast<double>(b.device_peak(Component::layer)) /
                    static_cast<double>(std::max<std::uint64_t>(1, a.device_peak(Component::layer))));
  }
}

TEST(TrainFootprint, RejectsBadInputs) {
  TrainFootprintInputs in = inputs();
  in.seq_len = 0;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.world = 4;
  in.layout.ep = 3;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.rank = 1;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.optimizer = "nope";
  EXPECT_THROW(train_footprint(in), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
