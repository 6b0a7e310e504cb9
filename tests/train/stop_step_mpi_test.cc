// Trainer::step's stop check between micro-batches (what `train` asks on SIGINT /
// SIGTERM): a stop any one rank raises abandons the step on every rank together after the
// same micro-batch, with no update and the step not counted; the next step is then the
// very step a run that was never interrupted takes (bit for bit). Without a stop the
// check runs between micro-batches only (not after the last) and changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct StopRun {
  CpuDevice dev{128 << 20};
  HostMemory host;
  ThreadPool pool{1};
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
  std::unique_ptr<Trainer> trainer;
  std::vector<KvRetrievalTask::Sequence> seqs;
  StopRun() {
    const int W = testing::world().size();
    ParallelLayout l;
    l.ep = W % 4 == 0 ? 4 : (W % 2 == 0 ? 2 : 1);
    l.vocab = W;
    groups = ProcessGroups::split(testing::world(), l);
    model = std::make_unique<MoeTransformer>(dev, host, groups, testing::small_train_config("stop-test"),
                                             ModelSchedules{});
    model->init_parameters(7);
    TrainerOptions o;
    o.optimizer_options.adam.lr = 1e-2f;
    o.lr = LrSchedule{1e-2f, 1e-3f, 0, 10};
    trainer = std::make_unique<Trainer>(*model, host, pool, o);
  }
  // Step k's three micro-batches on this rank (the same for a given k in every run).
  StepStats step(std::int64_t k, const StopCheck& stop = {}) {
    const KvRetrievalTask task = KvRetrievalTask::standard(300, 24, 5);
    const int W = testing::world().size(), r = testing::world().rank();
    seqs.clear();
    for (int m = 0; m < 3; ++m) seqs.push_back(task.sequence((k * 3 + m) * W + r));
    std::vector<MicroBatch> mb;
    for (const auto& s : seqs) mb.push_back({s.inputs.data(), s.targets.data(), 1, 24});
    return trainer->step(mb, stop);
  }
  std::vector<float> state() {
    const std::uint64_t n = trainer->shard_elements();
    std::vector<float> all(3 * n);
    trainer->read_shard(all.data(), all.data() + n, all.data() + 2 * n);
    return all;
  }
};

TEST(TrainerStop, AStopOnOneRankAbandonsTheStepEverywhereAndTheNextStepIsExact) {
  const int rank = testing::world().rank(), W = testing::world().size();
  // Interrupted: step 1, then step 2 stopped after its first micro-batch by the last rank
  // alone, then step 2 again.
  StopRun a;
  a.step(0);
  const std::vector<float> before = a.state();
  int asked = 0;
  const StepStats st = a.step(1, [&] {
    ++asked;
    return rank == W - 1 ? std::int64_t{15} : std::int64_t{0};
  });
  EXPECT_EQ(st.stopped, 15) << "every rank sees the stop the last rank raised";
  EXPECT_EQ(st.micro_batches_done, 1);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(a.trainer->steps_taken(), 1) << "an abandoned step is not counted";
  EXPECT_EQ(a.trainer->optimizer().steps_taken(), 1);
  const std::vector<float> after = a.state();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "the abandoned step updated";
  // A check that never fires is asked between micro-batches only.
  asked = 0;
  const StepStats a2 = a.step(1, [&] {
    ++asked;
    return std::int64_t{0};
  });
  EXPECT_EQ(a2.stopped, 0);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(a.trainer->steps_taken(), 2);

  // Never interrupted: steps 1 and 2.
  StopRun b;
  b.step(0);
  const StepStats b2 = b.step(1);
  EXPECT_EQ(a2.loss, b2.loss);
  EXPECT_EQ(a2.grad_norm, b2.grad_norm);
  const std::vector<float> sa = a.state(), sb = b.state();
  ASSERT_EQ(sa.size(), sb.size());
  EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0)
      << "the step after an abandoned one differs from the uninterrupted run's";
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
