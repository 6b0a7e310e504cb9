// FsdpUnits' overlap moves and sums the same bits as its blocking calls: a prefetched
// gather equals the blocking gather of the same unit; a prefetch that another gather
// overtakes still lands whole; the reduce-scatters handed to the collective thread, in a
// backward's order over two alternating gradient buffers (each rewritten as soon as the
// call after the one that took it returns) and ended by a blocking reduce_add as the
// embedding's ends a pass, leave the gradient shard bitwise equal to blocking reduce_adds,
// accumulating over two rounds. The collective thread itself
// rethrows its job's failure at wait() and refuses a communicator without concurrent
// threads. At every world size the mpi tests run (1-4 ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "peakbound/comm/collective_thread.h"
#include "peakbound/comm/single_rank.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/train/fsdp_units.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

// A distinct value for element i of unit u on rank r.
float value(int r, std::size_t u, std::uint64_t i) {
  return std::sin(0.29f * static_cast<float>(i) + 0.9f * static_cast<float>(u) + 0.5f * static_cast<float>(r)) * 0.4f;
}

void fill_params(FsdpUnits& f) {
  const int r = f.group().rank();
  for (std::size_t u = 0; u < f.size(); ++u)
    for (std::uint64_t i = 0; i < f.shard_len(u); ++i) f.params_shard()[f.shard_offset(u) + i] = value(r, u, i);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(FsdpOverlap, APrefetchedGatherIsTheBlockingGather) {
  Communicator& world = testing::world();
  const TensorTable table(testing::small_train_config("fsdp-overlap"));
  CpuDevice dev(16 * MiB);
  FsdpUnits f(dev, table, world);
  fill_params(f);
  for (std::size_t u = 0; u < f.size(); ++u) {
    const std::uint64_t n = f.layout(u).elements;
    std::vector<float> blocking(n, -1.0f), prefetched(n, -2.0f);
    f.gather(u, blocking.data());
    f.prefetch(u, prefetched.data());
    f.gather(u, prefetched.data());  // completes the prefetch
    EXPECT_TRUE(same_bits(blocking, prefetched)) << "unit " << u;
  }
  // A prefetch overtaken by a gather of another unit (and one left to finish()) lands whole.
  const std::size_t a = 1, b = f.size() - 1;
  std::vector<float> want_a(f.layout(a).elements), want_b(f.layout(b).elements);
  f.gather(a, want_a.data());
  f.gather(b, want_b.data());
  std::vector<float> got_a(want_a.size(), 0.0f), got_b(want_b.size(), 0.0f);
  f.prefetch(a, got_a.data());
  f.gather(b, got_b.data());
  EXPECT_TRUE(same_bits(want_a, got_a));
  EXPECT_TRUE(same_bits(want_b, got_b));
  std::fill(got_a.begin(), got_a.end(), 0.0f);
  f.prefetch(a, got_a.data());
  f.finish();
  EXPECT_TRUE(same_bits(want_a, got_a));
}

TEST(FsdpOverlap, BackgroundReduceScattersAreTheBlockingOnesBits) {
  Communicator& world = testing::world();
  // Open MPI grants MPI_THREAD_MULTIPLE: the reduce-scatters then really run on the thread.
  if (world.backend() == "mpi") {
    EXPECT_TRUE(world.concurrent_threads());
  }
  const TensorTable table(testing::small_train_config("fsdp-overlap"));
  CpuDevice dev_a(16 * MiB), dev_b(16 * MiB);
  FsdpUnits blocking(dev_a, table, world), overlapped(dev_b, table, world, Precision::f32, 0, true);
  EXPECT_EQ(overlapped.reduces_in_background(), world.size() > 1 && world.concurrent_threads());
  EXPECT_FALSE(blocking.reduces_in_background());  // off unless asked for
  std::uint64_t largest = 0;
  for (std::size_t u = 0; u < blocking.size(); ++u) largest = std::max(largest, blocking.layout(u).elements);
  std::vector<float> slots[2] = {std::vector<float>(largest), std::vector<float>(largest)};
  std::size_t calls = 0;
  for (int round = 0; round < 2; ++round) {
    // A backward's order: the last unit first, the gradient buffers alternating across
    // the rounds (a buffer is rewritten only after the call following the one that took it).
    for (std::size_t k = 0; k < blocking.size(); ++k) {
      const std::size_t u = blocking.size() - 1 - k;
      std::vector<float>& full = slots[calls++ % 2];
      for (std::uint64_t i = 0; i < blocking.layout(u).elements; ++i) full[i] = value(world.rank() + round, u, i);
      blocking.reduce_add(u, full.data());
      // The last unit as the embedding's: a blocking reduce_add completes the one in flight.
      if (u == 0)
        overlapped.reduce_add(u, full.data());
      else
        overlapped.reduce_add_async(u, full.data());
    }
  }
  overlapped.finish();
  for (std::uint64_t i = 0; i < blocking.shard_elements(); ++i)
    ASSERT_EQ(float_bits(overlapped.grads_shard()[i]), float_bits(blocking.grads_shard()[i])) << i;
  // zero_grads finishes what is in flight before it zeroes.
  overlapped.reduce_add_async(0, slots[calls % 2].data());
  overlapped.zero_grads();
  dev_b.synchronize();
  for (std::uint64_t i = 0; i < overlapped.shard_elements(); ++i) ASSERT_EQ(overlapped.grads_shard()[i], 0.0f) << i;
}

TEST(CollectiveThread, RunsOnItsOwnSplitAndRethrowsAFailureAtWait) {
  Communicator& world = testing::world();
  if (!world.concurrent_threads()) GTEST_SKIP() << "the '" << world.backend() << "' world allows no collective thread";
  CollectiveThread t(world);
  EXPECT_EQ(t.group().size(), world.size());
  EXPECT_EQ(t.group().rank(), world.rank());
  std::vector<std::int64_t> v = {world.rank() + 1};
  t.start([&v](Communicator& g) { g.all_reduce(v.data(), 1, DType::i64, ReduceOp::sum); });
  // The caller's thread runs a collective of the world meanwhile.
  std::int64_t w = 1;
  world.all_reduce(&w, 1, DType::i64, ReduceOp::sum);
  t.wait();
  const std::int64_t G = world.size();
  EXPECT_EQ(v[0], G * (G + 1) / 2);
  EXPECT_EQ(w, G);
  t.start([](Communicator&) { throw CommError("planted failure"); });
  try {
    t.wait();
    ADD_FAILURE() << "wait() did not rethrow";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "planted failure");
  }
  t.wait();  // the failure was collected once
}

TEST(CollectiveThread, RefusesACommunicatorWithoutConcurrentThreads) {
  SingleRankCommunicator single;
  try {
    CollectiveThread t(single);
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("does not allow collectives from two threads"), std::string::npos) << e.what();
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
