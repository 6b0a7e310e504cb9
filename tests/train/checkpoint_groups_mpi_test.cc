// Checkpoint groups in the trainer (CheckpointOptions::group_layers): the stack keeps one
// boundary per group of G layers and recomputes the group's other inputs in its backward,
// so the FSDP gathers of the backward follow (recompute first..last-1, backward last..first)
// per group, and ranks without tokens must make the same collective calls. A step with
// groups of 2, 3 and 7 (more than the layers) gives the loss and every gradient of the
// step without groups bit for bit, over two steps (the optimizer in between), with both
// checkpoint schedules, ranks without tokens, context parallelism and bf16. Runs at 1-4
// ranks (ep = the largest divisor of the ranks and the 8 experts, vocab group = all).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
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
  bool all = true;         // the four schedules (SCO's ring) or none (resident boundaries)
  bool empty_odd = false;  // odd ranks bring no sequences
  int cp = 1;
  Precision precision = Precision::f32;
  std::int64_t layers = 5;
};

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<unsigned char>> grads;  // every FSDP shard and store, after the last step
  std::vector<std::vector<unsigned char>> params;
};

std::vector<unsigned char> bytes_of(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::vector<unsigned char>(b, b + n);
}

Result run(const Case& k, std::int64_t group_layers) {
  Communicator& world = testing::world();
  const int W = world.size(), r = world.rank();
  ProcessGroups groups = ProcessGroups::split(world, testing::step_layout(W, k.cp));
  CpuDevice dev(128 << 20);
  HostMemory host;
  ThreadPool pool(1);
  ModelConfig c = testing::small_train_config("groups-test");
  c.num_layers = k.layers;
  ModelSchedules s;
  s.precision = k.precision;
  s.dispatch = k.all ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
  s.ring_dtp = k.all;
  s.checkpoint.schedule = k.all ? CheckpointSchedule::sco : CheckpointSchedule::resident;
  s.checkpoint.resident_layers = k.all ? std::optional<std::int64_t>(1) : std::nullopt;
  s.checkpoint.group_layers = group_layers;
  s.moe_tile = k.all ? 5 : 0;
  s.attention_piece = k.all ? 5 : 0;
  MoeTransformer model(dev, host, groups, c, s);
  model.init_parameters(11);
  TrainerOptions to;
  to.optimizer = k.all ? "offload_stream" : "device";
  Trainer trainer(model, host, pool, to);

  Result out;
  const std::int64_t S = 24;
  for (std::int64_t step = 0; step < 2; ++step) {
    const std::int64_t n = k.empty_odd && r % 2 == 1 ? 0 : 2;
    std::vector<std::int32_t> ids, tgt;
    testing::step_batch(step, r, k.cp, n, S, c.vocab_size, ids, tgt);
    const MicroBatch mb{ids.data(), tgt.data(), n, S};
    out.losses.push_back(trainer.step(std::span<const MicroBatch>(&mb, 1)).loss);
  }
  FsdpUnits& f = model.fsdp();
  const std::size_t pb = dtype_size(f.param_dtype());
  for (std::size_t u = 0; u < f.size(); ++u) {
    out.grads.push_back(bytes_of(f.grads_shard() + f.shard_offset(u), f.shard_len(u) * sizeof(float)));
    out.params.push_back(bytes_of(static_cast<const unsigned char*>(f.params_shard_raw()) + f.shard_offset(u) * pb,
                                  f.shard_len(u) * pb));
  }
  for (ParameterStore* st : model.stores()) {
    out.grads.push_back(bytes_of(st->grads_data(), st->elements() * sizeof(float)));
    out.params.push_back(bytes_of(st->params_raw(), st->elements() * dtype_size(st->param_dtype())));
  }
  return out;
}

void expect_same(const Case& k) {
  SCOPED_TRACE(std::string(k.name) + " at rank " + std::to_string(testing::world().rank()) + " of " +
               std::to_string(testing::world().size()));
  const Result base = run(k, 1);
  for (const std::int64_t G : {2, 3, 7}) {
    SCOPED_TRACE("groups of " + std::to_string(G));
    const Result g = run(k, G);
    ASSERT_EQ(g.losses.size(), base.losses.size());
    for (std::size_t i = 0; i < base.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&g.losses[i], &base.losses[i], sizeof(double)), 0)
          << "step " << i << ": " << g.losses[i] << " vs " << base.losses[i];
    ASSERT_EQ(g.grads.size(), base.grads.size());
    for (std::size_t i = 0; i < base.grads.size(); ++i) EXPECT_TRUE(g.grads[i] == base.grads[i]) << "gradients " << i;
    ASSERT_EQ(g.params.size(), base.params.size());
    for (std::size_t i = 0; i < base.params.size(); ++i) EXPECT_TRUE(g.params[i] == base.params[i]) << "store " << i;
  }
}

TEST(CheckpointGroups, TheTrainersStepsAreTheUngroupedBits) {
  expect_same({"all four"});
  expect_same({"none", false});
}

TEST(CheckpointGroups, RanksWithoutTokensMakeTheSameCalls) {
  if (testing::world().size() == 1) GTEST_SKIP() << "needs a rank without tokens beside one with";
  expect_same({"all four, odd ranks empty", true, true});
}

TEST(CheckpointGroups, ContextParallelAndBf16) {
  if (testing::world().size() % 2 == 0) expect_same({"all four, cp 2", true, false, 2});
  expect_same({"all four, bf16", true, false, 1, Precision::bf16});
}

TEST(CheckpointGroups, KeepAttentionIsRefused) {
  Communicator& world = testing::world();
  ParallelLayout layout;
  layout.ep = 1;
  layout.vocab = 1;
  ProcessGroups groups = ProcessGroups::split(world, layout);
  CpuDevice dev(64 << 20);
  HostMemory host;
  ModelSchedules s;
  s.keep_attention = true;
  s.checkpoint.group_layers = 2;
  try {
    MoeTransformer model(dev, host, groups, testing::small_train_config("groups-test"), s);
    FAIL() << "keep_attention with checkpoint groups was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint groups of 2"), std::string::npos) << e.what();
  }
  s.checkpoint.group_layers = 0;
  s.keep_attention = false;
  EXPECT_THROW(MoeTransformer(dev, host, groups, testing::small_train_config("groups-test"), s), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
