// The reach search against a known threshold: it finds the largest fitting context to its
// resolution, never tests a context twice, and handles a start that fails, nothing
// fitting, and the cap.
#include "peakbound/bench/reach_search.h"

#include <set>

#include <gtest/gtest.h>

#include "peakbound/core/error.h"

namespace peakbound::bench {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

ReachSearch run(std::int64_t threshold, ReachSearchOptions o) {
  return search_reach([threshold](std::int64_t c) { return c <= threshold; }, o);
}

void expect_consistent(const ReachSearch& r, std::int64_t threshold, const ReachSearchOptions& o) {
  std::set<std::int64_t> seen;
  for (const ReachTrial& t : r.trials) {
    EXPECT_TRUE(seen.insert(t.context).second) << "context " << t.context << " tested twice";
    EXPECT_EQ(t.fits, t.context <= threshold);
    EXPECT_EQ(t.context % o.multiple, 0);
  }
  EXPECT_LE(r.reach, threshold);
}

TEST(ReachSearch, FindsTheThresholdToItsResolution) {
  ReachSearchOptions o;
  for (std::int64_t threshold : {300, 1000, 1023, 5000, 70000, 123457}) {
    const ReachSearch r = run(threshold, o);
    expect_consistent(r, threshold, o);
    EXPECT_GT(r.first_failure, threshold);
    EXPECT_LE(r.first_failure - r.reach, std::max<std::int64_t>(o.multiple, r.reach / 16)) << threshold;
    EXPECT_FALSE(r.capped);
  }
}

TEST(ReachSearch, StartThatFailsHalvesDown) {
  ReachSearchOptions o;
  o.start = 4096;
  const ReachSearch r = run(700, o);
  expect_consistent(r, 700, o);
  EXPECT_GE(r.reach, 640);
  EXPECT_EQ(r.trials.front().context, 4096);
  EXPECT_FALSE(r.trials.front().fits);
}

TEST(ReachSearch, NothingFits) {
  ReachSearchOptions o;
  o.start = 256;
  const ReachSearch r = run(10, o);
  EXPECT_EQ(r.reach, 0);
  EXPECT_EQ(r.first_failure, 64);
  expect_consistent(r, 10, o);
}

TEST(ReachSearch, CapStopsTheDoubling) {
  ReachSearchOptions o;
  o.max_context = 3000;
  const ReachSearch r = run(1 << 30, o);
  EXPECT_TRUE(r.capped);
  EXPECT_EQ(r.reach, 2944);  // 3000 rounded down to the multiple
  EXPECT_EQ(r.first_failure, 0);
}

TEST(ReachSearch, RejectsBadOptions) {
  ReachSearchOptions o;
  o.multiple = 0;
  EXPECT_THROW(run(100, o), InvalidArgument);
  o = ReachSearchOptions{};
  o.start = 10;
  EXPECT_THROW(run(100, o), InvalidArgument);
  o = ReachSearchOptions{};
  o.max_context = 100;
  EXPECT_THROW(run(100, o), InvalidArgument);
  o = ReachSearchOptions{};
  o.resolution = 1.5;
  EXPECT_THROW(run(100, o), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::bench
