#include "peakbound/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnceAtEverySize) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (std::int64_t tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
      pool.parallel_for(tasks, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
      for (std::int64_t i = 0; i < tasks; ++i)
        ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << threads << " threads, task " << i;
    }
  }
}

TEST(ThreadPool, RethrowsATaskFailureAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](std::int64_t i) {
    if (i == 42) throw std::runtime_error("task 42");
  }), std::runtime_error);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(100, [&](std::int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, RefusesZeroThreads) { EXPECT_THROW(ThreadPool(0), InvalidArgument); }

}  // namespace
}  // namespace peakbound
