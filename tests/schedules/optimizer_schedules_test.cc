// The three optimizer schedules (device, offload_serial, offload_stream) on the same
// gradients: after several steps their master weights, m, v and device parameters
// are bitwise equal to each other and to the scalar reference kernel, for every
// dtype pair and for bucket sizes of one element, odd sizes that do not divide the
// count, an exact divisor and one larger than the shard; with clipping on and off.
// Also where each schedule puts its memory, and the errors a user can cause.
#include "peakbound/schedules/optimizer_schedule.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/adamw.h"
#include "peakbound/schedules/offload_stream_adamw.h"
#include "peakbound/schedules/optimizer_offload.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

struct Problem {
  std::int64_t n;
  DType pd, gd;
  std::vector<float> master0;
  std::vector<unsigned char> grads;  // in gd

  Problem(std::int64_t n_, DType p, DType g, unsigned seed) : n(n_), pd(p), gd(g) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> w(0.0f, 1.0f), gr(0.0f, 0.1f);
    master0.resize(static_cast<std::size_t>(n));
    for (auto& x : master0) x = w(rng);
    grads.resize(static_cast<std::size_t>(n) * dtype_size(g));
    for (std::int64_t i = 0; i < n; ++i) {
      float x = gr(rng);
      if (g == DType::bf16) reinterpret_cast<bf16*>(grads.data())[i] = to_bf16(x);
      else reinterpret_cast<float*>(grads.data())[i] = x;
    }
  }
};

// What a run ends with.
struct Final {
  std::vector<float> master, m, v;
  std::vector<unsigned char> params;
  bool operator==(const Final& o) const {
    auto eq = [](const auto& a, const auto& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
    };
    return eq(master, o.master) && eq(m, o.m) && eq(v, o.v) && eq(params, o.params);
  }
};

float lr_at(std::int64_t step) { return 1e-2f / static_cast<float>(step); }  // a per-step lr

// `steps` steps of the named schedule on its own CPU device.
Final run(const std::string& name, const Problem& p, const OptimizerOptions& o, int steps, int threads = 2) {
  CpuDevice dev(64 * MiB);
  HostMemory host;
  ThreadPool pool(threads);
  SingleRankCommunicator comm;
  const auto un = static_cast<std::uint64_t>(p.n);
  Buffer params = dev.allocate(Component::params, un * dtype_size(p.pd));
  Buffer grads = dev.allocate(Component::grads, un * dtype_size(p.gd));
  if (!p.grads.empty()) std::memcpy(grads.data(), p.grads.data(), p.grads.size());
  auto sched = make_optimizer_schedule(name, {dev, host, pool, comm},
                                       {params.data(), p.pd, grads.data(), p.gd, p.n}, o);
  EXPECT_EQ(sched->name(), name);
  sched->load(p.master0.data());
  for (int t = 1; t <= steps; ++t) sched->step(lr_at(t));
  EXPECT_EQ(sched->steps_taken(), steps);
  Final f;
  f.master.resize(un);
  f.m.resize(un);
  f.v.resize(un);
  sched->read_state(f.master.data(), f.m.data(), f.v.data());
  f.params.resize(un * dtype_size(p.pd));
  if (p.n > 0) std::memcpy(f.params.data(), params.data(), f.params.size());
  return f;
}

// The scalar reference kernel, clipped with the reference sum of squares.
Final reference(const Problem& p, const OptimizerOptions& o, int steps) {
  const auto un = static_cast<std::size_t>(p.n);
  Final f;
  f.master = p.master0;
  f.m.assign(un, 0.0f);
  f.v.assign(un, 0.0f);
  f.params.assign(un * dtype_size(p.pd), 0);
  const GradClip clip = clip_factor(cpu::sum_squares_reference(p.grads.data(), p.gd, p.n), o.adam.max_grad_norm);
  for (int t = 1; t <= steps; ++t)
    cpu::adamw_update_reference(adamw_step_scalars(o.adam, t, lr_at(t), clip.scale),
                                {f.master.data(), f.m.data(), f.v.data(), p.grads.data(), p.gd,
                                 f.params.data(), p.pd, p.n});
  return f;
}

TEST(OptimizerSchedules, AllThreeAreBitwiseTheReferenceForAnyBucketSize) {
  const std::int64_t n = 2003;  // prime: no bucket size below divides it
  for (DType pd : {DType::bf16, DType::f32})
    for (DType gd : {DType::bf16, DType::f32})
      for (float max_norm : {0.0f, 0.5f}) {
        Problem p(n, pd, gd, 21);
        OptimizerOptions o;
        o.adam.max_grad_norm = max_norm;
        const Final want = reference(p, o, 4);
        // The test must be able to fail: the state moved, and the clip did bind.
        ASSERT_NE(std::memcmp(want.master.data(), p.master0.data(), p.master0.size() * 4), 0);
        if (max_norm > 0) {
          ASSERT_LT(clip_factor(cpu::sum_squares_reference(p.grads.data(), gd, n), max_norm).scale, 1.0f);
        }
        const std::string what = std::string("params ") + std::string(dtype_name(pd)) + ", grads " +
                                 std::string(dtype_name(gd)) + ", max_norm " + std::to_string(max_norm);
        EXPECT_TRUE(run("device", p, o, 4) == want) << what;
        EXPECT_TRUE(run("offload_serial", p, o, 4) == want) << what;
        const std::uint64_t g = dtype_size(gd);
        const std::uint64_t bucket_elems[] = {1, 7, 333, 1000, static_cast<std::uint64_t>(n), 1 << 20};
        for (std::uint64_t elems : bucket_elems) {
          o.bucket_bytes = elems * g;
          EXPECT_TRUE(run("offload_stream", p, o, 4) == want) << what << ", bucket " << elems << " elements";
        }
        // A bucket size that is not a whole number of gradients rounds down.
        o.bucket_bytes = 1001 * g + 1;
        EXPECT_TRUE(run("offload_stream", p, o, 4) == want) << what << ", bucket of 1001 elements + 1 byte";
        // In place on the CPU device: no staging, the same bits, whatever the bucket.
        o.in_place = true;
        EXPECT_TRUE(run("offload_serial", p, o, 4) == want) << what << ", in place";
        for (std::uint64_t elems : {std::uint64_t{7}, std::uint64_t{1} << 20}) {
          o.bucket_bytes = elems * g;
          EXPECT_TRUE(run("offload_stream", p, o, 4) == want) << what << ", in place, bucket " << elems;
        }
      }
}

TEST(OptimizerSchedules, ThreadCountDoesNotChangeTheBits) {
  // Buckets longer than one parallel task, so the pool splits each of them.
  Problem p(3 * kAdamWChunk + 7, DType::bf16, DType::bf16, 5);
  OptimizerOptions o;
  o.bucket_bytes = 2 * (kAdamWChunk + 12345);
  const Final one = run("offload_stream", p, o, 3, 1);
  EXPECT_TRUE(run("offload_stream", p, o, 3, 3) == one);
  EXPECT_TRUE(run("device", p, o, 3, 2) == one);
}

TEST(OptimizerSchedules, EmptyShardIsANoOp) {
  Problem p(0, DType::bf16, DType::bf16, 1);
  OptimizerOptions o;
  for (const auto& name : optimizer_schedule_names()) EXPECT_TRUE(run(name, p, o, 2) == reference(p, o, 2)) << name;
}

TEST(OptimizerSchedules, StateIsOnTheDeviceOnlyForTheDeviceBaseline) {
  const std::int64_t n = 1 << 20;
  Problem p(n, DType::bf16, DType::bf16, 2);
  for (const auto& name : optimizer_schedule_names()) {
    CpuDevice dev(64 * MiB);
    HostMemory host;
    ThreadPool pool(1);
    SingleRankCommunicator comm;
    Buffer params = dev.allocate(Component::params, n * 2);
    Buffer grads = dev.allocate(Component::grads, n * 2);
    OptimizerOptions o;
    o.bucket_bytes = 64 * 1024;  // 32768 bf16 gradients
    auto s = make_optimizer_schedule(name, {dev, host, pool, comm}, {params.data(), DType::bf16, grads.data(), DType::bf16, n}, o);
    s->load(p.master0.data());
    s->step(1e-3f);
    // On the device three Arena allocations (the Arena staggers them, outside the
    // ledger); on the host one staggered block: the arrays plus kStagger before each but the first.
    const std::uint64_t stagger = StaggeredBlock::kStagger;
    const std::uint64_t state = 12ull * n + 2 * stagger;
    if (name == "device") {
      EXPECT_EQ(dev.arena().peak(Component::optimizer), 12ull * n);
      EXPECT_EQ(host.peak(Component::optimizer), 0u);
    } else {
      EXPECT_EQ(dev.arena().peak(Component::optimizer), 0u) << name;
      EXPECT_EQ(host.peak(Component::optimizer), state) << name;
      auto* off = dynamic_cast<OffloadedAdamW*>(s.get());
      ASSERT_NE(off, nullptr);
      // Serial stages every gradient and parameter; the stream two buckets of each.
      const std::uint64_t staging = name == "offload_serial" ? 4ull * n + stagger : 2ull * 32768 * (2 + 2) + 3 * stagger;
      EXPECT_EQ(off->host_staging_bytes(), staging) << name;
      EXPECT_EQ(host.peak(Component::comm), staging) << name;
    }
    // Nothing but params and grads on the device for the offload schedules.
    if (name != "device") {
      EXPECT_EQ(dev.arena().peak(), 4ull * n) << name;
    }
  }
}

TEST(OptimizerSchedules, OffloadFitsWhereTheDeviceBaselineDoesNot) {
  const std::int64_t n = 1 << 20;  // params + grads 4 MiB, state 12 MiB
  CpuDevice dev(8 * MiB);
  HostMemory host;
  ThreadPool pool(1);
  SingleRankCommunicator comm;
  Buffer params = dev.allocate(Component::params, n * 2);
  Buffer grads = dev.allocate(Component::grads, n * 2);
  ParamShard shard{params.data(), DType::bf16, grads.data(), DType::bf16, n};
  try {
    make_optimizer_schedule("device", {dev, host, pool, comm}, shard, {});
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_optimizer_schedule("offload_stream", {dev, host, pool, comm}, shard, {}));
}

// A CPU device holding a problem's parameters and its gradients, and what a schedule
// needs beside them.
struct Rig {
  CpuDevice dev{64 * MiB};
  HostMemory host;
  ThreadPool pool{2};
  SingleRankCommunicator comm;
  const Problem& p;
  Buffer params, grads;
  explicit Rig(const Problem& problem)
      : p(problem),
        params(dev.allocate(Component::params, static_cast<std::uint64_t>(p.n) * dtype_size(p.pd))),
        grads(dev.allocate(Component::grads, static_cast<std::uint64_t>(p.n) * dtype_size(p.gd))) {
    std::memcpy(grads.data(), p.grads.data(), p.grads.size());
  }
  OptimizerContext ctx() { return {dev, host, pool, comm}; }
  ParamShard shard() const { return {params.data(), p.pd, grads.data(), p.gd, p.n}; }
};

TEST(OptimizerSchedules, StreamReportsItsBucketsAndStages) {
  Problem p(100000, DType::bf16, DType::bf16, 4);
  Rig r(p);
  OptimizerOptions o;
  o.bucket_bytes = 30000 * 2;
  OffloadStreamAdamW s(r.ctx(), r.shard(), o);
  EXPECT_EQ(s.bucket_elements(), 30000);
  EXPECT_EQ(s.bucket_count(), 4);
  s.load(p.master0.data());
  OptimizerStepTimes t = s.step(1e-3f);
  EXPECT_EQ(t.buckets, 4);
  EXPECT_GT(t.d2h_seconds, 0.0);
  EXPECT_GT(t.update_seconds, 0.0);
  EXPECT_GT(t.h2d_seconds, 0.0);
  EXPECT_GE(t.step_seconds, t.update_seconds);
  EXPECT_GT(t.clip.norm, 0.0);
}

TEST(OptimizerSchedules, InPlaceStagesNothingAndCopiesNothing) {
  Problem p(100000, DType::bf16, DType::f32, 6);
  for (const std::string name : {"offload_serial", "offload_stream"}) {
    Rig r(p);
    OptimizerOptions o;
    o.bucket_bytes = 30000 * 4;
    o.in_place = true;
    auto s = make_optimizer_schedule(name, r.ctx(), r.shard(), o);
    s->load(p.master0.data());
    const CopyStats before = r.dev.copy_stats();
    OptimizerStepTimes t = s->step(1e-3f);
    const CopyStats after = r.dev.copy_stats();
    EXPECT_GT(t.update_seconds, 0.0) << name;
    EXPECT_EQ(t.d2h_seconds, 0.0) << name;
    EXPECT_EQ(t.h2d_seconds, 0.0) << name;
    EXPECT_EQ(t.buckets, 1) << name;
    for (int k = 0; k < 3; ++k) EXPECT_EQ(after.bytes[k], before.bytes[k]) << name << ": copied " << k;
    EXPECT_EQ(r.host.peak(Component::comm), 0u) << name;
    EXPECT_EQ(dynamic_cast<OffloadedAdamW*>(s.get())->host_staging_bytes(), 0u) << name;
    EXPECT_GE(r.host.peak(Component::optimizer), 12ull * p.n) << name;  // the state stays on the host
  }
}

TEST(OptimizerSchedules, UserErrorsAreInvalidArgument) {
  CpuDevice dev(8 * MiB);
  HostMemory host;
  ThreadPool pool(1);
  SingleRankCommunicator comm;
  Buffer params = dev.allocate(Component::params, 1024);
  Buffer grads = dev.allocate(Component::grads, 1024);
  ParamShard shard{params.data(), DType::bf16, grads.data(), DType::f32, 256};
  EXPECT_THROW(make_optimizer_schedule("zero3", {dev, host, pool, comm}, shard, {}), InvalidArgument);
  OptimizerOptions o;
  o.bucket_bytes = 3;  // less than one f32 gradient
  EXPECT_THROW(make_optimizer_schedule("offload_stream", {dev, host, pool, comm}, shard, o), InvalidArgument);
  ParamShard bad = shard;
  bad.grad_dtype = DType::i32;
  EXPECT_THROW(make_optimizer_schedule("device", {dev, host, pool, comm}, bad, {}), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
