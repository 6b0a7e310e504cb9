// The vocabulary-parallel embedding (ModelSchedules::vocab_parallel_embedding) against the
// FSDP embedding: the embedding's rows sharded over the vocabulary group, each token's row
// fetched from its owner in rounds and its gradient sent back there. The forward gives the
// same rows, so the first step's loss is the same bits; the gradient of the embedding is
// summed in another order (by source rank, then token) and the updated embedding matches to
// 1e-5 relative over two steps, the second step's loss to 1e-6. Odd round sizes (7 tokens),
// ranks without tokens, every token's row in one shard, context parallelism and bf16, at
// 1-4 ranks (ep = the largest divisor of the ranks and the 8 experts, vocab group = all, or
// 2 where the world is 4: two replicas of each shard).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/schedules/vocab_loss.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"
#include "tests/train/step_batch.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Case {
  const char* name;
  std::int64_t rows = 7;     // tokens a rank's round holds
  bool empty_odd = false;    // odd ranks bring no sequences
  bool one_shard = false;    // every id in the first shard's rows
  int cp = 1;
  int vocab = 0;             // 0: the world
  Precision precision = Precision::f32;
};

struct Result {
  std::vector<double> losses;
  std::vector<float> embedding;  // this rank's vocabulary shard's rows of the updated embedding
};

std::vector<float> to_f32(const void* p, std::size_t n, DType t) {
  std::vector<float> out(n);
  if (t == DType::f32) {
    std::memcpy(out.data(), p, n * sizeof(float));
  } else {
    ops::host_to_f32(out.data(), static_cast<const bf16*>(p), static_cast<std::int64_t>(n));
  }
  return out;
}

Result run(const Case& k, bool vocab_parallel) {
  Communicator& world = testing::world();
  const int W = world.size(), r = world.rank();
  ProcessGroups groups = ProcessGroups::split(world, testing::step_layout(W, k.cp, k.vocab));
  CpuDevice dev(128 << 20);
  HostMemory host;
  ThreadPool pool(1);
  const ModelConfig c = testing::small_train_config("vocab-embedding-test");
  ModelSchedules s;
  s.precision = k.precision;
  s.dispatch = DispatchKind::pipelined_llep;
  s.ring_dtp = true;
  s.checkpoint.schedule = CheckpointSchedule::sco;
  s.attention_piece = 5;
  s.moe_tile = 5;
  s.vocab_parallel_embedding = vocab_parallel;
  s.embedding_rows = k.rows;
  MoeTransformer model(dev, host, groups, c, s);
  model.init_parameters(5);
  TrainerOptions to;
  to.optimizer = "offload_stream";
  Trainer trainer(model, host, pool, to);

  Result out;
  const std::int64_t S = 24, V = c.vocab_size;
  const int P = groups.vocab->size();
  for (std::int64_t step = 0; step < 2; ++step) {
    const std::int64_t n = k.empty_odd && r % 2 == 1 ? 0 : 2;
    std::vector<std::int32_t> ids, tgt;
    testing::step_batch(step, r, k.cp, n, S, k.one_shard ? vocab_shard(V, P, 0).rows : V, ids, tgt);
    const MicroBatch mb{ids.data(), tgt.data(), n, S};
    out.losses.push_back(trainer.step(std::span<const MicroBatch>(&mb, 1)).loss);
  }
  // The updated embedding's rows of this rank's vocabulary shard.
  const VocabShard sh = vocab_shard(V, P, groups.vocab->rank());
  const std::size_t n = static_cast<std::size_t>(sh.rows * c.hidden_size);
  const std::string name = "model.embed_tokens.weight";
  if (vocab_parallel) {
    ParameterStore& head = *model.stores()[1];
    if (sh.rows > 0) out.embedding = to_f32(head.param_raw(name), n, head.param_dtype());
  } else {
    FsdpUnits& f = model.fsdp();
    const std::size_t u = FsdpUnits::embed();
    std::vector<unsigned char> whole(f.layout(u).elements * dtype_size(f.param_dtype()));
    f.gather(u, whole.data());
    const std::size_t at = f.find(name).second->offset + static_cast<std::size_t>(sh.offset * c.hidden_size);
    out.embedding = to_f32(whole.data() + at * dtype_size(f.param_dtype()), n, f.param_dtype());
  }
  return out;
}

void expect_same(const Case& k) {
  SCOPED_TRACE(std::string(k.name) + " at rank " + std::to_string(testing::world().rank()) + " of " +
               std::to_string(testing::world().size()));
  const Result a = run(k, false), b = run(k, true);
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(std::memcmp(&a.losses[0], &b.losses[0], sizeof(double)), 0) << a.losses[0] << " vs " << b.losses[0];
  const double tol2 = k.precision == Precision::bf16 ? 1e-3 : 1e-6;
  EXPECT_LT(std::abs(a.losses[1] - b.losses[1]) / std::abs(a.losses[1]), tol2) << a.losses[1] << " vs " << b.losses[1];
  ASSERT_EQ(a.embedding.size(), b.embedding.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.embedding.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a.embedding[i] - b.embedding[i])));
    ref = std::max(ref, static_cast<double>(std::abs(a.embedding[i])));
  }
  // bf16: the updated parameters are the rounded copies of fp32 masters that may differ in
  // their last bits, so one bf16 ulp (2^-8 relative) is the resolution.
  const double tol = k.precision == Precision::bf16 ? 1.0 / 128 : 1e-5;
  if (!a.embedding.empty()) {
    EXPECT_LE(diff, tol * ref) << "the updated embedding: max |diff| " << diff << " of max " << ref;
  }
}

TEST(VocabEmbedding, EqualsTheFsdpEmbedding) {
  expect_same({"rounds of 7"});
  expect_same({"one round", 1024});
  expect_same({"every row in the first shard", 7, false, true});
}

TEST(VocabEmbedding, RanksWithoutTokensAndReplicatedShards) {
  if (testing::world().size() == 1) GTEST_SKIP() << "needs a rank without tokens beside one with";
  expect_same({"odd ranks empty", 7, true});
  if (testing::world().size() == 4) expect_same({"vocab group 2 (two replicas)", 7, false, false, 1, 2});
}

TEST(VocabEmbedding, ContextParallelAndBf16) {
  if (testing::world().size() % 2 == 0) expect_same({"cp 2", 5, false, false, 2});
  expect_same({"bf16", 7, false, false, 1, 0, Precision::bf16});
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
