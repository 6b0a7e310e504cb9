#include "peakbound/core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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

// Calls far shorter than a worker's wake-up: most workers wake after the call they
// were woken for has returned, and must take nothing from it or from the next call
// with the old call's function (each call's function checks it is its own).
TEST(ThreadPool, BackToBackShortCallsRunOnlyTheirOwnTasks) {
  for (int threads : {2, 4, 8}) {
    ThreadPool pool(threads);
    std::atomic<std::int64_t> wrong{0};
    for (int call = 0; call < 20000; ++call) {
      const std::int64_t tasks = 2 + call % 3;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
      pool.parallel_for(tasks, [&, call](std::int64_t i) {
        if (i < 0 || i >= tasks) ++wrong;
        else hits[static_cast<std::size_t>(i)]++;
        (void)call;
      });
      for (std::int64_t i = 0; i < tasks; ++i)
        ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << threads << " threads, call " << call;
    }
    EXPECT_EQ(wrong.load(), 0);
  }
}

// After a failure the rest of the call's tasks are skipped, not left waiting: the
// call returns (with the error) even when most tasks were never run. Which tasks run
// before the failure is recorded depends on scheduling: the thread that throws can be
// descheduled between its task starting and the failure being stored, and on a loaded
// machine (CI runs this under ASan on 2 shared cores) the others may run every
// remaining task in that window. So the first task to run throws, the call is repeated,
// and the test asks that some call skipped tasks: a pool that never skips runs all of
// them in every call and fails; one that skips fails only if every try loses the race.
TEST(ThreadPool, AFailureSkipsTheRestAndReturns) {
  ThreadPool pool(4);
  constexpr int kTasks = 100000;
  int fewest = kTasks;
  for (int attempt = 0; attempt < 20 && fewest == kTasks; ++attempt) {
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(kTasks, [&](std::int64_t) {
      if (ran.fetch_add(1) == 0) throw std::runtime_error("first task");
    }), std::runtime_error);
    fewest = std::min(fewest, ran.load());
  }
  EXPECT_LT(fewest, kTasks);
}

TEST(ThreadPool, RefusesZeroThreads) { EXPECT_THROW(ThreadPool(0), InvalidArgument); }

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
