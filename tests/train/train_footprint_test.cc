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
    {0x757288993203b6a4ull,
     {1153792, 1153792, 1679616, 18432, 191232, 70400, 164352, 98560, 61952, 1536},
     559872,
     {{"optimizer load", 3973376}, {"embedding forward", 4018432}, {"forward attention project", 4018176},
       {"forward attention", 4085248}, {"forward dense mlp", 4047872}, {"forward mlp", 4165120},
       {"loss forward", 4069888}, {"loss backward", 4081664}, {"final norm backward", 4011520},
       {"backward mlp", 4218368}, {"backward dense mlp", 4085504}, {"backward attention recompute project", 4018176},
       {"backward attention recompute", 4085248}, {"backward attention reproject", 4025088},
       {"backward attention output", 4025600}, {"backward attention", 4162816},
       {"backward attention project", 4030464}, {"embedding backward", 4018432}, {"optimizer", 3973376}}},
    // all
    {0xc7d4c9ba41ca0888ull,
     {1153792, 1153792, 0, 12288, 191232, 57600, 164352, 98560, 61952, 1536},
     4500736,
     {{"optimizer load", 2293760}, {"embedding forward", 2344960}, {"forward attention project", 2332416},
       {"forward attention", 2399488}, {"forward dense mlp", 2368256}, {"forward mlp", 2479360},
       {"loss forward", 2383104}, {"loss backward", 2383104}, {"final norm backward", 2325760},
       {"backward mlp", 2532608}, {"backward dense mlp", 2412032}, {"backward attention recompute project", 2332416},
       {"backward attention recompute", 2399488}, {"backward attention reproject", 2339328},
       {"backward attention output", 2339840}, {"backward attention", 2477056},
       {"backward attention project", 2344704}, {"embedding backward", 2351104}, {"optimizer", 2306048}}},
    // all sco offloaded, eval
    {0x6d945e2c6340886aull,
     {2374912, 2374912, 0, 18432, 191232, 58624, 164352, 98560, 61952, 1536},
     9551104,
     {{"optimizer load", 4736000}, {"embedding forward", 4787200}, {"forward attention project", 4780800},
       {"forward attention", 4847872}, {"forward dense mlp", 4810496}, {"forward mlp", 4927744},
       {"loss forward", 4831488}, {"loss backward", 4831488}, {"loss eval", 4819968}, {"final norm backward", 4774144},
       {"backward mlp", 4980992}, {"backward dense mlp", 4854272}, {"backward attention recompute project", 4780800},
       {"backward attention recompute", 4847872}, {"backward attention reproject", 4787712},
       {"backward attention output", 4788224}, {"backward attention", 4925440},
       {"backward attention project", 4793088}, {"embedding backward", 4793344}, {"optimizer", 4748288}}},
    // none cp 2 rank 1 of 2
    {0x0e4d586594529207ull,
     {658176, 658176, 840192, 10752, 111360, 46848, 159488, 57600, 30976, 1536},
     280064,
     {{"optimizer load", 2111744}, {"embedding forward", 2154240}, {"forward attention project", 2138112},
       {"forward attention", 2208512}, {"forward dense mlp", 2155520}, {"forward mlp", 2223872},
       {"loss forward", 2171392}, {"loss backward", 2181376}, {"final norm backward", 2135040},
       {"backward mlp", 2254848}, {"backward dense mlp", 2177536}, {"backward attention recompute project", 2138112},
       {"backward attention recompute", 2208512}, {"backward attention reproject", 2142208},
       {"backward attention output", 2142464}, {"backward attention", 2286080},
       {"backward attention project", 2145280}, {"embedding backward", 2154240}, {"optimizer", 2111744}}},
    // all cp 2 rank 1 of 2, eval
    {0xad55e3fc252262baull,
     {658176, 658176, 0, 7168, 111360, 36096, 159488, 57600, 30976, 1536},
     2262272,
     {{"optimizer load", 1271552}, {"embedding forward", 1317632}, {"forward attention project", 1294336},
       {"forward attention", 1364736}, {"forward dense mlp", 1315328}, {"forward mlp", 1380096},
       {"loss forward", 1313536}, {"loss backward", 1326848}, {"loss eval", 1313024}, {"final norm backward", 1291264},
       {"backward mlp", 1411072}, {"backward dense mlp", 1340928}, {"backward attention recompute project", 1294336},
       {"backward attention recompute", 1364736}, {"backward attention reproject", 1298432},
       {"backward attention output", 1298688}, {"backward attention", 1442304},
       {"backward attention project", 1301504}, {"embedding backward", 1321216}, {"optimizer", 1278720}}},
    // all rank 3 of 4, uneven, skew 2
    {0x94ad2a2bf8604b0full,
     {412672, 412672, 0, 6144, 684288, 46592, 148480, 49408, 15616, 1536},
     1148160,
     {{"optimizer load", 764160}, {"embedding forward", 809728}, {"forward attention project", 784384},
       {"forward attention", 851200}, {"forward dense mlp", 801792}, {"forward mlp", 1163008},
       {"loss forward", 808192}, {"loss backward", 827904}, {"final norm backward", 782336}, {"backward mlp", 1472768},
       {"backward dense mlp", 823808}, {"backward attention recompute project", 784384},
       {"backward attention recompute", 851200}, {"backward attention reproject", 787968},
       {"backward attention output", 788224}, {"backward attention", 922368}, {"backward attention project", 790528},
       {"embedding backward", 812800}, {"optimizer", 770304}}},
    // none rank 2 of 4, no tokens
    {0x452885c615fbd8d1ull,
     {412672, 412672, 422400, 0, 191232, 67840, 0, 0, 15616, 1024},
     140800,
     {{"optimizer load", 1186560}, {"embedding forward", 1225472}, {"forward attention project", 1186560},
       {"forward attention", 1186560}, {"forward dense mlp", 1186560}, {"forward mlp", 1338112},
       {"loss forward", 1241088}, {"loss backward", 1255424}, {"final norm backward", 1188608},
       {"backward mlp", 1377792}, {"backward dense mlp", 1186560}, {"backward attention recompute project", 1186560},
       {"backward attention recompute", 1186560}, {"backward attention reproject", 1186560},
       {"backward attention output", 1186560}, {"backward attention", 1186560},
       {"backward attention project", 1186560}, {"embedding backward", 1225472}, {"optimizer", 1186560}}},
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
