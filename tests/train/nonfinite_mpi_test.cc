// A non-finite loss or gradient norm (here: a learning rate of 1e30 sends the weights
// past fp32's range after one step) stops the step before any update, on every rank with
// the same message naming the step and the first non-finite gradient; with
// skip_nonfinite the step is counted but changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {

ModelConfig nf_config() {
  ModelConfig c;
  c.name = "nonfinite-test";
  c.family = "peakbound";
  c.vocab_size = 300;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_dense_layers = 1;
  c.dense_intermediate_size = 48;
  c.num_experts = 4;
  c.top_k = 2;
  c.moe_intermediate_size = 24;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.initializer_range = 0.1;
  return c;
}

struct NfRun {
  CpuDevice dev{128 << 20};
  HostMemory host;
  ThreadPool pool{1};
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
  std::unique_ptr<Trainer> trainer;
  explicit NfRun(bool skip) {
    const int W = testing::world().size();
    ParallelLayout l;
    l.ep = W % 4 == 0 ? 4 : (W % 2 == 0 ? 2 : 1);
    l.vocab = W;
    groups = ProcessGroups::split(testing::world(), l);
    model = std::make_unique<MoeTransformer>(dev, host, groups, nf_config(), ModelSchedules{});
    model->init_parameters(3);
    TrainerOptions o;
    o.optimizer_options.adam.lr = 1e30f;
    o.optimizer_options.adam.max_grad_norm = 0;
    o.lr = LrSchedule{1e30f, 1e30f, 0, 10};
    o.skip_nonfinite = skip;
    trainer = std::make_unique<Trainer>(*model, host, pool, o);
  }
  StepStats step(std::int64_t k) {
    const KvRetrievalTask task = KvRetrievalTask::standard(300, 24, 5);
    const KvRetrievalTask::Sequence s = task.sequence(k * testing::world().size() + testing::world().rank());
    const MicroBatch mb{s.inputs.data(), s.targets.data(), 1, 24};
    return trainer->step({&mb, 1});
  }
  std::vector<float> master() {
    std::vector<float> m(trainer->shard_elements()), a(m.size()), b(m.size());
    trainer->read_shard(m.data(), a.data(), b.data());
    return m;
  }
};

TEST(NonFinite, StopsBeforeTheUpdateNamingTheStepAndTheTensor) {
  NfRun r(false);
  EXPECT_FALSE(r.step(0).skipped);  // finite, and the update sends the weights to ~1e30
  const std::vector<float> before = r.master();
  try {
    r.step(1);
    ADD_FAILURE() << "a step with weights near 1e30 had a finite loss";
  } catch (const NonFinite& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 2:"), std::string::npos) << what;
    EXPECT_NE(what.find("first non-finite gradient: "), std::string::npos) << what;
    EXPECT_NE(what.find(" on rank "), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
    // The same message on every rank (the CLI prints rank 0's).
    const std::uint64_t h = std::hash<std::string>{}(what);
    std::uint64_t hs[2] = {h, ~h};
    testing::world().all_reduce(hs, 2, DType::i64, ReduceOp::max);
    EXPECT_EQ(hs[0], h);
    EXPECT_EQ(hs[1], ~h);
  }
  EXPECT_EQ(r.trainer->steps_taken(), 1);
  const std::vector<float> after = r.master();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "the stopped step updated";
}

TEST(NonFinite, SkipCountsTheStepAndChangesNothing) {
  NfRun r(true);
  r.step(0);
  const std::vector<float> before = r.master();
  const StepStats st = r.step(1);
  EXPECT_TRUE(st.skipped);
  EXPECT_NE(st.nonfinite.find("step 2:"), std::string::npos) << st.nonfinite;
  EXPECT_EQ(r.trainer->steps_taken(), 2);
  EXPECT_EQ(r.trainer->steps_skipped(), 1);
  EXPECT_EQ(r.trainer->optimizer().steps_taken(), 1);
  const std::vector<float> after = r.master();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "the skipped step updated";
}

}  // namespace
}  // namespace peakbound
