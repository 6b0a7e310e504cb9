// A non-finite loss or gradient norm (here: a learning rate of 1e30 sends the weights
// past fp32's range after one step) stops the step before any update, on every rank with
// the same message naming the step and the first non-finite gradient; with
// skip_nonfinite the step is counted but changes nothing. The same under bf16
// (ModelSchedules::precision): the bf16 compute copy has fp32's range, so the diverging run
// stops the same way; and a master beyond bf16's range (about 3.39e38, finite in fp32)
// rounds to inf in the compute copy: the message names that bf16 parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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
  explicit NfRun(bool skip, Precision prec = Precision::f32, float lr = 1e30f) {
    const int W = testing::world().size();
    ParallelLayout l;
    l.ep = W % 4 == 0 ? 4 : (W % 2 == 0 ? 2 : 1);
    l.vocab = W;
    groups = ProcessGroups::split(testing::world(), l);
    ModelSchedules sched;
    sched.precision = prec;
    model = std::make_unique<MoeTransformer>(dev, host, groups, nf_config(), sched);
    model->init_parameters(3);
    TrainerOptions o;
    o.optimizer_options.adam.lr = lr;
    o.optimizer_options.adam.max_grad_norm = 0;
    o.lr = LrSchedule{lr, lr, 0, 10};
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

// The same message on every rank (the CLI prints rank 0's), one line.
void expect_same_everywhere(const std::string& what) {
  EXPECT_EQ(what.find('\n'), std::string::npos);
  const std::uint64_t h = std::hash<std::string>{}(what);
  std::uint64_t hs[2] = {h, ~h};
  testing::world().all_reduce(hs, 2, DType::i64, ReduceOp::max);
  EXPECT_EQ(hs[0], h);
  EXPECT_EQ(hs[1], ~h);
}

void check_stops(Precision prec) {
  NfRun r(false, prec);
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
    if (testing::world().rank() == 0) std::printf("%s: %s\n", prec == Precision::bf16 ? "bf16" : "f32", what.c_str());
    expect_same_everywhere(what);
  }
  EXPECT_EQ(r.trainer->steps_taken(), 1);
  const std::vector<float> after = r.master();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "the stopped step updated";
}

TEST(NonFinite, StopsBeforeTheUpdateNamingTheStepAndTheTensor) { check_stops(Precision::f32); }
TEST(NonFinite, Bf16StopsBeforeTheUpdateNamingTheStepAndTheTensor) { check_stops(Precision::bf16); }

void check_skips(Precision prec) {
  NfRun r(true, prec);
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

TEST(NonFinite, SkipCountsTheStepAndChangesNothing) { check_skips(Precision::f32); }
TEST(NonFinite, Bf16SkipCountsTheStepAndChangesNothing) { check_skips(Precision::bf16); }

// A bf16 run whose master (fp32, finite) is past bf16's largest finite value, 3.3895e38:
// restore narrows it to inf in the compute copy, the next loss is non-finite, and the
// message names that parameter element (rank 0's first shard segment outside the
// embedding and the experts, which every token's forward reads).
TEST(NonFinite, Bf16MasterBeyondBf16RangeNamesTheParameter) {
  constexpr float kBig = 3.4e38f;
  ASSERT_TRUE(std::isfinite(kBig));
  ASSERT_TRUE(std::isinf(to_f32(to_bf16(kBig))));
  NfRun r(false, Precision::bf16, 1e-3f);
  EXPECT_FALSE(r.step(0).skipped);
  const std::uint64_t n = r.trainer->shard_elements();
  std::vector<float> master(n), m(n), v(n);
  r.trainer->read_shard(master.data(), m.data(), v.data());
  std::string expect;
  if (testing::world().rank() == 0) {
    for (const ShardSegment& s : r.trainer->shard_segments())
      if (s.count > 0 && s.name.find("embed_tokens") == std::string::npos &&
          s.name.find("experts") == std::string::npos) {
        master[s.shard_offset] = kBig;
        expect = "first non-finite bf16 parameter: " + s.name + " element " + std::to_string(s.begin) + " (inf) on rank 0";
        break;
      }
    EXPECT_FALSE(expect.empty()) << "rank 0 holds no parameter outside the embedding and the experts";
  }
  r.trainer->restore(master.data(), m.data(), v.data(), r.trainer->optimizer().steps_taken(),
                     r.trainer->steps_taken());
  try {
    r.step(1);
    ADD_FAILURE() << "a step with an inf bf16 parameter had a finite loss";
  } catch (const NonFinite& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 2:"), std::string::npos) << what;
    if (testing::world().rank() == 0) {
      EXPECT_NE(what.find(expect), std::string::npos) << what;
      std::printf("bf16 master 3.4e38: %s\n", what.c_str());
    }
    expect_same_everywhere(what);
  }
  EXPECT_EQ(r.trainer->steps_taken(), 1);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
