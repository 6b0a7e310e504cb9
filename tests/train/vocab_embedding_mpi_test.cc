// The vocabulary-parallel embedding (ModelSchedules::vocab_parallel_embedding) against the
// FSDP embedding: the embedding's rows sharded over the vocabulary group, each token's row
// fetched from its owner in rounds and its gradient sent back there. The forward gives the
// same rows, so one pass's loss is the same bits; the embedding's gradient is summed in
// another order (by source rank, then token) and matches to 1e-5 of its largest element.
// Odd round sizes (7 tokens), ranks without tokens, every token's row in one shard, context
// parallelism and bf16, at 1-4 ranks (ep = the largest divisor of the ranks and the 8 experts, vocab group = all, or
// 2 where the world is 4: two replicas of each shard).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/vocab_loss.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/moe_transformer.h"
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
  double loss = 0;                   // the pass's loss over the world
  std::vector<float> embedding_grad;  // this rank's vocabulary shard's rows, summed over the world
};

// One forward_backward of the small model with either embedding.
Result run(const Case& k, bool vocab_parallel) {
  Communicator& world = testing::world();
  const int W = world.size(), r = world.rank();
  ProcessGroups groups = ProcessGroups::split(world, testing::step_layout(W, k.cp, k.vocab));
  CpuDevice dev(128 << 20);
  HostMemory host;
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

  const std::int64_t S = 24, V = c.vocab_size, H = c.hidden_size;
  const int P = groups.vocab->size();
  const std::int64_t n = k.empty_odd && r % 2 == 1 ? 0 : 2;
  std::vector<std::int32_t> ids, tgt;
  testing::step_batch(0, r, k.cp, n, S, k.one_shard ? vocab_shard(V, P, 0).rows : V, ids, tgt);
  std::int64_t valid = std::count_if(tgt.begin(), tgt.end(), [](std::int32_t t) { return t != -100; });
  world.all_reduce(&valid, 1, DType::i64, ReduceOp::sum);
  model.zero_grads();
  const BatchSums sums = model.forward_backward(ids.data(), tgt.data(), n, S, 1.0f / float(valid), 1.0f);
  double ce = sums.ce;
  world.all_reduce(&ce, 1, DType::f64, ReduceOp::sum);
  Result out;
  out.loss = ce / double(valid) + sums.aux;
  // The embedding's gradient rows of this rank's vocabulary shard, summed over the world:
  // the stores' over their groups (the trainer reduce-scatters them), the FSDP unit's
  // gathered whole.
  std::vector<ParameterStore*> st = model.stores();
  std::vector<Communicator*> g = model.store_groups();
  for (std::size_t i = 0; i < st.size(); ++i)
    g[i]->all_reduce(st[i]->grads_data(), st[i]->elements(), DType::f32, ReduceOp::sum);
  const VocabShard sh = vocab_shard(V, P, groups.vocab->rank());
  const auto rows = static_cast<std::size_t>(sh.rows * H);
  const std::string name = "model.embed_tokens.weight";
  if (vocab_parallel) {
    ParameterStore& head = *st[1];
    if (sh.rows > 0) out.embedding_grad.assign(head.grad(name), head.grad(name) + rows);
  } else {
    FsdpUnits& f = model.fsdp();
    std::vector<float> whole(f.layout(FsdpUnits::embed()).elements);
    f.gather_grads(FsdpUnits::embed(), whole.data());
    const auto at = static_cast<std::ptrdiff_t>(f.find(name).second->offset + static_cast<std::size_t>(sh.offset * H));
    out.embedding_grad.assign(whole.begin() + at, whole.begin() + at + static_cast<std::ptrdiff_t>(rows));
  }
  return out;
}

void expect_same(const Case& k) {
  SCOPED_TRACE(std::string(k.name) + " at rank " + std::to_string(testing::world().rank()) + " of " +
               std::to_string(testing::world().size()));
  const Result a = run(k, false), b = run(k, true);
  // The same rows: the same forward, bit for bit.
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  // The gradient summed in another order (by source rank, then token): to rounding.
  ASSERT_EQ(a.embedding_grad.size(), b.embedding_grad.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.embedding_grad.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a.embedding_grad[i] - b.embedding_grad[i])));
    ref = std::max(ref, static_cast<double>(std::abs(a.embedding_grad[i])));
  }
  // The largest element over the world: a shard no token's id falls in ("every row in the
  // first shard") has a zero gradient, which must then be zero in both.
  testing::world().all_reduce(&ref, 1, DType::f64, ReduceOp::max);
  EXPECT_GT(ref, 0.0);
  EXPECT_LE(diff, 1e-5 * ref) << "the embedding's gradient: max |diff| " << diff << " of max " << ref;
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
