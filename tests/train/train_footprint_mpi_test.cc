// train_footprint at 1-4 ranks (ep the largest divisor of the world and E = 8, the
// head over every rank): after one Trainer::step the Arena's measured peaks equal the
// footprint per component and in total, with schedules none (standard EP,
// materialized vocab, resident boundaries, device AdamW) and all (PipelinedLLEP,
// Ring-DTP, SCO, offload_stream AdamW), and under context parallelism; in f32 and bf16.
#include <string>

#include "peakbound/model/hf_config.h"
#include "tests/comm/world.h"
#include "tests/train/train_footprint_check.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using namespace train_footprint_check;

TEST(TrainFootprintMpi, MeasuredEqualsFootprintNone) { check(testing::world(), kNone, tiny_model()); }

TEST(TrainFootprintMpi, MeasuredEqualsFootprintAll) { check(testing::world(), kAll, tiny_model()); }

// Variant v on the tiny model: as it is, with odd ranks holding no sequences, under context
// parallelism's uneven shards (27 tokens over cp 2) and in bf16.
void check_layouts(Communicator& world, const Variant& v) {
  check(world, v, tiny_model());
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  if (world.size() == 1) seqs[0] = 3;
  check(world, v, tiny_model(), nullptr, seqs);
  if (world.size() % 2 == 0) check(world, v, tiny_model(), nullptr, {}, 2, 27);
  check(world, v, tiny_model(), nullptr, {}, 1, 24, Precision::bf16);
}

// The MLP sublayers over row tiles (ModelSchedules::moe_tile): the tiles every rank runs are
// the group's most (ranks without tokens run them empty), under context parallelism's
// uneven shards, with the sigmoid router's sequence-wise statistics, and in bf16.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintRowTiles) {
  Communicator& world = testing::world();
  check_layouts(world, kAllTiled);
  ModelConfig c = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/dots1");
  c.seq_aux_loss_coef = 1e-3;
  check(world, kAllTiled, c);
}

// The attention sublayers in pieces (ModelSchedules::attention_piece): the queries of the
// forward and the backward a piece at a time, under context parallelism (the ring's pieces,
// uneven shards), with ranks without tokens, kept attention and in bf16.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintAttentionPieces) {
  Communicator& world = testing::world();
  check_layouts(world, kAllPieces);
  Variant kept = kAllPieces;
  kept.keep_attention = true;
  check(world, kept, tiny_model());
}

// SCO's one-slot ring (CheckpointOptions::prefetch_depth 0): the decoder layers' forward in
// place in the slot; the ring of one boundary and everything else as planned, in the
// layouts above, with the attention kept, and on MLA.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintOneSlotRing) {
  Communicator& world = testing::world();
  CheckpointOptions o;
  o.prefetch_depth = 0;
  check(world, kAll, tiny_model(), &o);
  check(world, kAllPieces, tiny_model(), &o);
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  if (world.size() == 1) seqs[0] = 3;
  check(world, kAllPieces, tiny_model(), &o, seqs);
  if (world.size() % 2 == 0) check(world, kAllPieces, tiny_model(), &o, {}, 2, 27);
  check(world, kAllPieces, tiny_model(), &o, {}, 1, 24, Precision::bf16);
  check(world, kAllKept, tiny_model(), &o);
  check(world, kAll, load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/deepseek_v3"), &o);
}

// keep_attention with ranks without tokens (no stack there: nothing kept) and under
// context parallelism (the ring's o and lse kept per rank).
TEST(TrainFootprintMpi, MeasuredEqualsFootprintAttentionKept) {
  Communicator& world = testing::world();
  check(world, kAllKept, tiny_model());
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  if (world.size() == 1) seqs[0] = 2;
  check(world, kAllKept, tiny_model(), nullptr, seqs);
  if (world.size() >= 2 && world.size() % 2 == 0) check(world, kAllKept, tiny_model(), nullptr, {}, 2);
}

// keep_experts over ranks: each rank keeps the rows its experts compute (LLEP's helpers
// the lent experts' too), ranks without tokens included (their experts compute the
// group's rows), and under context parallelism.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintExpertsKept) {
  Communicator& world = testing::world();
  check(world, kNoneKeptExperts, tiny_model());
  check(world, kAllKeptExperts, tiny_model());
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  if (world.size() == 1) seqs[0] = 2;
  check(world, kAllKeptExperts, tiny_model(), nullptr, seqs);
  if (world.size() >= 2 && world.size() % 2 == 0) check(world, kAllKeptExperts, tiny_model(), nullptr, {}, 2);
}

// Odd ranks hold no sequences (at one rank: 2): those build no stack but still run
// every dispatch; the vocabulary loss sizes its buffers by its group's uneven counts.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintRanksWithoutTokens) {
  Communicator& world = testing::world();
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  check(world, kNone, tiny_model(), nullptr, seqs);
  check(world, kAll, tiny_model(), nullptr, seqs);
}

// Context parallel: every cp dividing the world (consecutive groups share sequences),
// on a length the 2 cp chunks do not divide evenly (uneven shards, rank by rank): the
// ring attention's buffers and the shorter local token counts, measured == footprint.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintContextParallel) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  for (int cp = 2; cp <= world.size(); ++cp) {
    if (world.size() % cp != 0) continue;
    check(world, kNone, tiny_model(), nullptr, {}, cp, 27);
    check(world, kAll, tiny_model(), nullptr, {}, cp, 27);
  }
}

// DeepSeek-V3's router state (the tiny dots.llm1 fixture: two MoE layers with a correction
// bias each, their loads, a dense layer 0, a sliding layer 2): measured == footprint.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintSigmoidRouter) {
  ModelConfig c = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/dots1");
  check(testing::world(), kNone, c);
  check(testing::world(), kAll, c);
  // With the sequence-wise balance loss: its statistics [M, sequences, E] held through the pass,
  // ranks without tokens (none) included, and under context parallelism 2.
  c.seq_aux_loss_coef = 1e-3;
  check(testing::world(), kAll, c);
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < testing::world().size(); ++r) seqs.push_back(r % 2 == 0 ? 3 : 0);
  check(testing::world(), kNone, c, nullptr, seqs);
  if (testing::world().size() % 2 == 0) check(testing::world(), kAll, c, nullptr, {}, 2, 27);
}

// Multi-head latent attention (the tiny DeepSeek-V3 fixture: its latent, rope key and
// per-head K / V buffers), in both precisions and under context parallelism 2 where the
// world is even, the ring carrying the latent (no K / V on the layer; the ring's expanded
// block) or K and V; at one device with pieces of 5 tokens the latent form too (the keys
// expanded a piece at a time): measured == footprint.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintMla) {
  Communicator& world = testing::world();
  const ModelConfig c = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/deepseek_v3");
  check(world, kNone, c);
  check(world, kAll, c);
  check(world, kAll, c, nullptr, {}, 1, 24, Precision::bf16);
  check(world, kAllPieces, c);
  check(world, kAllPieces, c, nullptr, {}, 1, 24, Precision::bf16);
  if (world.size() % 2 == 0) {
    check(world, kAll, c, nullptr, {}, 2, 27);
    check(world, kAll, c, nullptr, {}, 2, 27, Precision::bf16);
    ModelConfig kv = c;
    kv.mla_latent_ring = false;
    check(world, kAll, kv, nullptr, {}, 2, 27);
    check(world, kNone, kv, nullptr, {}, 2, 27, Precision::bf16);
  }
}

// The same in bf16 (ModelSchedules::precision): the bf16 model's measured peaks equal
// train_footprint per component and in total, at every world size and cp.
// Checkpoint groups of 2 and 3 over 5 layers (the first group the remainder): the
// recomputation's dispatch and buffers, with ranks without tokens (they make the same
// calls), under context parallelism and in bf16.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintCheckpointGroups) {
  Communicator& world = testing::world();
  for (const std::int64_t G : {2, 3}) {
    SCOPED_TRACE("groups of " + std::to_string(G));
    CheckpointOptions o;
    o.group_layers = G;
    o.resident_layers = 1;
    check(world, kAll, tiny_model(5), &o);
    check(world, kNone, tiny_model(5), &o);
    std::vector<std::int64_t> seqs;
    for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
    if (world.size() == 1) seqs[0] = 3;
    check(world, kAllPieces, tiny_model(5), &o, seqs);
    if (world.size() % 2 == 0) check(world, kAllPieces, tiny_model(5), &o, {}, 2, 27);
    check(world, kAllTiled, tiny_model(5), &o, {}, 1, 24, Precision::bf16);
  }
}

// The vocabulary-parallel embedding: its exchange buffers in the embedding's forward and
// backward (rounds sized by the group's most tokens: ranks without tokens hold them too),
// the embedding's rows in the head's store and no FSDP unit of it; under context
// parallelism and in bf16.
TEST(TrainFootprintMpi, MeasuredEqualsFootprintVocabEmbedding) {
  check_layouts(testing::world(), kAllVocabEmbedding);
  Variant none = kAllVocabEmbedding;
  none.dispatch = DispatchKind::standard_ep;
  none.ring_dtp = false;
  none.checkpoint = CheckpointSchedule::resident;
  none.optimizer = "device";
  check(testing::world(), none, tiny_model());
}

TEST(TrainFootprintMpi, MeasuredEqualsFootprintBf16) {
  Communicator& world = testing::world();
  check(world, kNone, tiny_model(), nullptr, {}, 1, 24, Precision::bf16);
  check(world, kAll, tiny_model(), nullptr, {}, 1, 24, Precision::bf16);
}

TEST(TrainFootprintMpi, MeasuredEqualsFootprintBf16RanksWithoutTokens) {
  Communicator& world = testing::world();
  std::vector<std::int64_t> seqs;
  for (int r = 0; r < world.size(); ++r) seqs.push_back(r % 2 == 0 ? 2 : 0);
  check(world, kNone, tiny_model(), nullptr, seqs, 1, 24, Precision::bf16);
  check(world, kAll, tiny_model(), nullptr, seqs, 1, 24, Precision::bf16);
}

TEST(TrainFootprintMpi, MeasuredEqualsFootprintBf16ContextParallel) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  for (int cp = 2; cp <= world.size(); ++cp) {
    if (world.size() % cp != 0) continue;
    check(world, kNone, tiny_model(), nullptr, {}, cp, 27, Precision::bf16);
    check(world, kAll, tiny_model(), nullptr, {}, cp, 27, Precision::bf16);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
