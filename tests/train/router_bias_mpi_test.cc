// DeepSeek-V3's auxiliary-loss-free balancing in the model (MoeTransformer::update_router_bias,
// called by Trainer::step) on the dots1 fixture (tests/fixtures/hf/dots1: two MoE layers with
// the sigmoid router and a correction bias each): after a step every bias has moved by
// exactly +speed, -speed or not at all and some have moved; the biases after three steps are
// the same bits at 1-4 ranks (the loads are summed over the world, every rank's tokens once);
// an evaluation between steps changes nothing; speed 0 freezes them; a checkpoint holds them
// and a resume restores them bit for bit; export writes them under the checkpoint's names.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using Vec = std::vector<float>;
const std::string kDir = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/dots1";
constexpr std::int64_t kSeqLen = 16, kSequences = 8;  // the world's batch, split over the ranks

struct BiasRun {
  ModelConfig config = load_hf_config(kDir);
  ParallelLayout layout;
  CpuDevice dev{128 << 20};
  HostMemory host;
  ThreadPool pool{1};
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
  std::unique_ptr<Trainer> trainer;

  Communicator& world;

  explicit BiasRun(float speed, Communicator& w = testing::world()) : world(w) {
    const int W = world.size();
    layout.ep = W;
    while (config.num_experts % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
    layout.vocab = W;
    groups = ProcessGroups::split(world, layout);
    model = std::make_unique<MoeTransformer>(dev, host, groups, config, ModelSchedules{});
    model->load_hf(kDir);
    TrainerOptions o;
    o.optimizer = "device";
    o.lr = LrSchedule{3e-3f, 3e-4f, 1, 8};
    o.router_bias_speed = speed;
    trainer = std::make_unique<Trainer>(*model, host, pool, o);
  }
  // The biases, layer by layer, copied to the host.
  std::vector<Vec> biases() {
    std::vector<Vec> out;
    for (const auto& [name, values] : model->router_buffers()) out.emplace_back(values, values + config.num_experts);
    return out;
  }
  // Step `step`'s batch: kSequences seeded sequences over the world, this rank's share.
  void step(std::int64_t step) {
    const int W = world.size(), r = world.rank();
    std::vector<std::int32_t> ids, targets;
    std::int64_t mine = 0;
    for (std::int64_t s = r; s < kSequences; s += W, ++mine)
      for (std::int64_t t = 0; t < kSeqLen; ++t) {
        const auto v = static_cast<std::int32_t>((s * 131 + t * 17 + step * 7 + (s * t) % 5) % config.vocab_size);
        ids.push_back(v);
        targets.push_back(t + 1 < kSeqLen ? static_cast<std::int32_t>((v + 3) % config.vocab_size) : -100);
      }
    const MicroBatch b{ids.data(), targets.data(), mine, kSeqLen};
    trainer->step(std::span<const MicroBatch>(&b, 1));
  }
};

// The biases after three steps (replicated: every rank's are the same).
std::vector<Vec> after_three(float speed, bool evaluate_between, Communicator& w = testing::world()) {
  BiasRun run(speed, w);
  for (std::int64_t s = 1; s <= 3; ++s) {
    run.step(s);
    if (evaluate_between) {
      std::vector<std::int32_t> ids(kSeqLen, 5), targets(kSeqLen, 6);
      run.model->forward(ids.data(), targets.data(), 1, kSeqLen);
    }
  }
  return run.biases();
}

TEST(RouterBias, EachStepMovesEveryBiasBySpeedOrNotAtAll) {
  BiasRun run(0.001f);
  const std::vector<Vec> before = run.biases();
  ASSERT_EQ(before.size(), 2u);
  run.step(1);
  const std::vector<Vec> after = run.biases();
  int moved = 0;
  for (std::size_t l = 0; l < before.size(); ++l)
    for (std::size_t e = 0; e < before[l].size(); ++e) {
      const float d = after[l][e] - before[l][e];
      const bool ok = after[l][e] == before[l][e] || after[l][e] == before[l][e] + 0.001f ||
                      after[l][e] == before[l][e] - 0.001f;
      EXPECT_TRUE(ok) << "layer " << l << " expert " << e << " moved by " << d;
      moved += after[l][e] != before[l][e];
    }
  EXPECT_GT(moved, 0);
}

// A one-rank run of the same world batch (each rank runs it alone) is the reference: the
// loads are the world's sums, so every world size moves the biases alike.
TEST(RouterBias, TheSameAtEveryWorldSizeAndUnchangedByEvaluation) {
  const std::vector<Vec> got = after_three(0.001f, false);
  EXPECT_EQ(after_three(0.001f, true), got);
  SingleRankCommunicator alone;
  EXPECT_EQ(after_three(0.001f, false, alone), got);
  // Replicated: rank 0's are every rank's.
  std::vector<float> flat;
  for (const Vec& v : got) flat.insert(flat.end(), v.begin(), v.end());
  std::vector<float> first = flat;
  testing::world().broadcast(first.data(), first.size(), DType::f32, 0);
  EXPECT_EQ(flat, first);
}

TEST(RouterBias, SpeedZeroFreezesThem) {
  BiasRun run(0.0f);
  const std::vector<Vec> before = run.biases();
  run.step(1);
  run.step(2);
  EXPECT_EQ(run.biases(), before);
}

TEST(RouterBias, ACheckpointHoldsThemAndExportWritesThem) {
  Communicator& world = testing::world();
  const std::string dir = (fs::path(::testing::TempDir()) / ("pb_router_bias_" + std::to_string(world.size()))).string();
  if (world.rank() == 0) fs::remove_all(dir);
  world.barrier();
  std::vector<Vec> saved;
  std::string step_dir;
  {
    BiasRun a(0.001f);
    a.step(1);
    a.step(2);
    saved = a.biases();
    RunState st;
    st.step = 2;
    step_dir = save_checkpoint(dir, *a.trainer, st, a.config, a.layout);
  }
  BiasRun b(0.001f);
  EXPECT_NE(b.biases(), saved);  // the fixture's, before the resume
  load_checkpoint(step_dir, *b.trainer);
  EXPECT_EQ(b.biases(), saved);
  world.barrier();
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
