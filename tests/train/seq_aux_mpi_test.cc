// DeepSeek-V3's complementary sequence-wise balance loss in the model (ModelConfig::
// seq_aux_loss_coef, train's --seq-aux-coef) on the dots1 fixture (two MoE layers with the
// sigmoid router): its gradient is the derivative of the loss it reports (the router weight's
// gradient with the loss minus without it, against central differences of the reported loss
// along a random direction, the checkpoint rewritten each side); the loss and the router
// weights' gradients are the same at 1-4 ranks and under context parallelism 2 as a lone
// rank's run of the same world batch (each sequence's statistics summed over its cp group, the
// mean over the world's sequences); the footprint holds the statistics (measured == planned
// is TrainFootprintMpi's); a softmax router refuses it in one line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/moe_transformer.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using Vec = std::vector<float>;
const std::string kDir = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/dots1";
constexpr std::int64_t kSeqLen = 16, kSequences = 4;  // the world's batch
const char* const kGates[2] = {"model.layers.1.mlp.gate.weight", "model.layers.2.mlp.gate.weight"};

struct Out {
  double aux = 0;
  std::vector<Vec> gates;  // the two router weights' gradients, whole
  Vec loads;               // this rank's token-copies per expert, [2, E]: the routing's choice
};

// One forward + backward of the world batch (kSequences seeded sequences, a contiguous block
// per data-parallel group) on `world` with context parallelism cp, the model read from dir.
// moe_tile: the MoE layers' row tile (ModelSchedules::moe_tile; 0 whole).
Out run(const std::string& dir, double coef, std::int64_t cp, Communicator& world, std::int64_t moe_tile = 0) {
  const int W = world.size(), r = world.rank();
  ModelConfig config = load_hf_config(dir);
  config.seq_aux_loss_coef = coef;
  ParallelLayout layout;
  layout.ep = W;
  while (config.num_experts % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
  layout.vocab = W;
  layout.cp = cp;
  ProcessGroups groups = ProcessGroups::split(world, layout);
  CpuDevice dev(256 << 20);
  HostMemory host;
  ModelSchedules sched;
  sched.moe_tile = moe_tile;
  MoeTransformer model(dev, host, groups, config, sched);
  model.load_hf(dir);
  const std::int64_t D = W / cp, d = r / cp, mine = kSequences / D, first = d * mine;
  std::vector<std::int32_t> ids, targets;
  for (std::int64_t s = first; s < first + mine; ++s)
    for (std::int64_t t = 0; t < kSeqLen; ++t) {
      const auto v = static_cast<std::int32_t>((s * 131 + t * 17 + (s * t) % 5) % config.vocab_size);
      ids.push_back(v);
      targets.push_back(t + 1 < kSeqLen ? static_cast<std::int32_t>((v + 3) % config.vocab_size) : -100);
    }
  model.zero_grads();
  const BatchSums sums = model.forward_backward(ids.data(), targets.data(), mine, kSeqLen,
                                                1.0f / static_cast<float>(kSequences * (kSeqLen - 1)), 1.0f);
  Out o;
  o.aux = sums.aux;
  o.loads.assign(model.router_loads(), model.router_loads() + 2 * config.num_experts);
  FsdpUnits& fsdp = model.fsdp();
  for (const char* name : kGates) {
    const auto [unit, view] = fsdp.find(name);
    Vec whole(fsdp.layout(unit).elements);
    fsdp.gather_grads(unit, whole.data());
    o.gates.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(view->offset),
                         whole.begin() + static_cast<std::ptrdiff_t>(view->offset + view->numel()));
  }
  return o;
}

double max_rel(const Vec& a, const Vec& b) {
  double m = 0, worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(b[i])));
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return m > 0 ? worst / m : worst;
}

// dots1's checkpoint with `name` moved by eps * dir, in a folder of its own (rank 0 writes).
std::string moved_checkpoint(const std::string& name, const Vec& dir, double eps, const std::string& tag) {
  Communicator& world = testing::world();
  // A folder no other run of this test shares (rank 0's pid, known to every rank).
  std::int64_t pid = world.rank() == 0 ? static_cast<std::int64_t>(getpid()) : 0;
  world.all_reduce(&pid, 1, DType::i64, ReduceOp::max);
  const fs::path out = fs::temp_directory_path() / ("pb_seq_aux_" + tag + "_" + std::to_string(pid));
  if (world.rank() == 0) {
    fs::remove_all(out);
    fs::create_directories(out);
    fs::copy_file(fs::path(kDir) / "config.json", out / "config.json");
    const SafeTensorsFile f = SafeTensorsFile::open(kDir + "/model.safetensors");
    std::vector<Vec> keep;
    std::vector<SafeTensorOut> tensors;
    keep.reserve(f.tensors().size());
    for (const SafeTensorInfo& t : f.tensors()) {
      keep.push_back(f.read_f32(t.name));
      if (t.name == name)
        for (std::size_t i = 0; i < keep.back().size(); ++i)
          keep.back()[i] = static_cast<float>(keep.back()[i] + eps * dir[i]);
      tensors.push_back({t.name, "F32", t.shape, keep.back().data(), keep.back().size() * sizeof(float)});
    }
    write_safetensors((out / "model.safetensors").string(), tensors);
  }
  world.barrier();
  return out.string();
}

TEST(SeqAux, ItsGradientIsTheDerivativeOfTheLossItReports) {
  Communicator& world = testing::world();
  const double coef = 0.1;
  const Out with = run(kDir, coef, 1, world), without = run(kDir, 0.0, 1, world);
  EXPECT_EQ(without.aux, 0.0);
  EXPECT_GT(with.aux, 0.0);
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0.0, 1.0);
  // Layer 1's router weight, along two random directions. (Layer 2's own router has a token
  // within ~1e-4 of a tie on this batch: any step that resolves the difference flips it, and
  // the loads check below refuses such a difference. Its balance term is still in these
  // differences: layer 1's router moves layer 2's input, and layer 2's term reaches layer 1
  // through the residual stream.)
  for (int trial = 0; trial < 2; ++trial) {
    const std::size_t g = 0;
    SCOPED_TRACE(std::string(kGates[g]) + " direction " + std::to_string(trial));
    Vec dir(with.gates[g].size());
    double norm = 0;
    for (float& x : dir) {
      x = static_cast<float>(n(rng));
      norm += static_cast<double>(x) * x;
    }
    for (float& x : dir) x = static_cast<float>(x / std::sqrt(norm));  // a unit direction
    double analytic = 0;
    for (std::size_t i = 0; i < dir.size(); ++i)
      analytic += (static_cast<double>(with.gates[g][i]) - without.gates[g][i]) * dir[i];
    const double eps = 2e-4;
    const std::string up_dir = moved_checkpoint(kGates[g], dir, eps, "up");
    const std::string down_dir = moved_checkpoint(kGates[g], dir, -eps, "down");
    const Out down_run = run(down_dir, coef, 1, world);
    const double down = down_run.aux;
    const Out up_run = run(up_dir, coef, 1, world);
    const double up = up_run.aux;
    world.barrier();
    if (world.rank() == 0) {
      fs::remove_all(up_dir);
      fs::remove_all(down_dir);
    }
    // The selection must hold across the difference (a near-tie flipped by the step would
    // move f, which has no derivative): the loads of both sides equal the base run's.
    ASSERT_EQ(up_run.loads, with.loads) << "the step moved a token to another expert; take a smaller eps";
    ASSERT_EQ(down_run.loads, with.loads) << "the step moved a token to another expert; take a smaller eps";
    const double fd = (up - down) / (2 * eps);
    if (world.rank() == 0)
      std::printf("  seq aux %s: d loss along a random direction %.7g, central difference %.7g\n", kGates[g], analytic,
                  fd);
    EXPECT_NEAR(analytic, fd, 2e-2 * std::abs(fd) + 2e-5);
    EXPECT_GT(std::abs(analytic), 1e-4);  // the term reaches this router
  }
}

TEST(SeqAux, TheSameAtEveryLayoutAsALoneRankOfTheWorldBatch) {
  Communicator& world = testing::world();
  SingleRankCommunicator alone;
  const double coef = 0.05;
  const Out want = run(kDir, coef, 1, alone);
  for (std::int64_t cp : {1, 2}) {
    if (world.size() % cp != 0 || kSequences % (world.size() / cp) != 0) continue;
    SCOPED_TRACE("cp " + std::to_string(cp));
    const Out got = run(kDir, coef, cp, world);
    EXPECT_NEAR(got.aux, want.aux, 1e-6 * want.aux);
    for (std::size_t g = 0; g < 2; ++g) EXPECT_LT(max_rel(got.gates[g], want.gates[g]), 1e-5) << kGates[g];
    if (world.rank() == 0)
      std::printf("  seq aux at %d ranks cp %lld: loss %.8g (lone rank %.8g)\n", world.size(),
                  static_cast<long long>(cp), got.aux, want.aux);
  }
}

// Row tiles of the MoE layers (ModelSchedules::moe_tile) that start and end inside the
// 16-token sequences (5, 7) or hold several whole ones (32): the statistics and the weights
// of each sequence the same, so the loss, the routing and the router gradients are the
// untiled run's (the order of the sums across tiles moves: 1e-5).
TEST(SeqAux, RowTilesAcrossSequencesGiveTheUntiledRun) {
  Communicator& world = testing::world();
  const double coef = 0.05;
  for (std::int64_t cp : {1, 2}) {
    if (world.size() % cp != 0 || kSequences % (world.size() / cp) != 0) continue;
    const Out want = run(kDir, coef, cp, world);
    for (std::int64_t tile : {5, 7, 32}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + " tile " + std::to_string(tile));
      const Out got = run(kDir, coef, cp, world, tile);
      EXPECT_NEAR(got.aux, want.aux, 1e-6 * want.aux);
      EXPECT_EQ(got.loads, want.loads);
      for (std::size_t g = 0; g < 2; ++g) EXPECT_LT(max_rel(got.gates[g], want.gates[g]), 1e-5) << kGates[g];
    }
  }
}

TEST(SeqAux, ASoftmaxRouterRefusesIt) {
  ModelConfig c = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe");
  c.seq_aux_loss_coef = 1e-4;
  try {
    check_trainable(c);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sequence-wise balance loss (--seq-aux-coef)"), std::string::npos)
        << e.what();
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
