// Global gradient-norm clipping across ranks: each rank holds one shard of the same
// global gradient; the norm every rank uses is the norm of the whole vector, every
// rank scales by the same bits, and each shard's update equals the reference kernel
// run with that scale. Runs as 1 rank and under mpirun -np 2, 3, 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/adamw.h"
#include "peakbound/schedules/optimizer_schedule.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

TEST(OptimizerClipAcrossRanks, EveryRankClipsByTheGlobalNorm) {
  Communicator& w = world();
  const std::int64_t total = 30011;
  std::mt19937 rng(77);
  std::normal_distribution<float> gr(0.0f, 0.1f), init(0.0f, 1.0f);
  std::vector<bf16> all_grads(static_cast<std::size_t>(total));
  std::vector<float> all_master(static_cast<std::size_t>(total));
  for (auto& g : all_grads) g = to_bf16(gr(rng));
  for (auto& x : all_master) x = init(rng);
  double global_sq = 0;
  for (bf16 g : all_grads) global_sq += static_cast<double>(to_f32(g)) * to_f32(g);

  const std::int64_t first = total * w.rank() / w.size(), last = total * (w.rank() + 1) / w.size();
  const std::int64_t n = last - first;
  CpuDevice dev(16ull << 20);
  HostMemory host;
  ThreadPool pool(1);
  Buffer params = dev.allocate(Component::params, static_cast<std::uint64_t>(n) * 2);
  Buffer grads = dev.allocate(Component::grads, static_cast<std::uint64_t>(n) * 2);
  std::memcpy(grads.data(), all_grads.data() + first, static_cast<std::size_t>(n) * 2);
  OptimizerOptions o;
  o.adam.max_grad_norm = 1.0f;
  o.bucket_bytes = 2000;

  std::vector<std::vector<float>> masters;
  float scale = 0;
  for (const auto& name : optimizer_schedule_names()) {
    auto s = make_optimizer_schedule(name, {dev, host, pool, w}, {params.data(), DType::bf16, grads.data(), DType::bf16, n}, o);
    s->load(all_master.data() + first);
    OptimizerStepTimes t = s->step(1e-2f);
    EXPECT_NEAR(t.clip.norm, std::sqrt(global_sq), 1e-9 * std::sqrt(global_sq)) << name;
    ASSERT_LT(t.clip.scale, 1.0f) << "the clip must bind for this test to mean anything";
    // The same bits on every rank.
    std::vector<float> scales(static_cast<std::size_t>(w.size()));
    w.all_gather(&t.clip.scale, scales.data(), 1, DType::f32);
    for (float x : scales) EXPECT_EQ(std::memcmp(&x, &t.clip.scale, 4), 0) << name;
    scale = t.clip.scale;
    std::vector<float> master(static_cast<std::size_t>(n)), m(master), v(master);
    s->read_state(master.data(), m.data(), v.data());
    masters.push_back(master);
  }
  for (const auto& m : masters) EXPECT_EQ(std::memcmp(m.data(), masters[0].data(), m.size() * 4), 0);

  // The shard's update is the reference kernel with the global scale.
  std::vector<float> ref(all_master.begin() + first, all_master.begin() + last), rm(ref.size()), rv(ref.size());
  std::vector<bf16> rp(ref.size());
  cpu::adamw_update_reference(adamw_step_scalars(o.adam, 1, 1e-2f, scale),
                              {ref.data(), rm.data(), rv.data(), all_grads.data() + first, DType::bf16, rp.data(),
                               DType::bf16, n});
  EXPECT_EQ(std::memcmp(ref.data(), masters[0].data(), ref.size() * 4), 0);
  // And that scale is the single-process one, up to the order of the sum.
  const float single = clip_factor(global_sq, 1.0f).scale;
  EXPECT_NEAR(scale, single, 1e-6f * single);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
