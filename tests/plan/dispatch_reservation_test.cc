// The planner's dispatch reservation at a routing skew covers every routing up to it
// (the planner and `train`'s printed plan reserve for a skew, by default the worst):
// dispatch_sizes_estimate never shrinks as the skew grows. Before, a skew past LLEP's
// lambda reserved only the spilled load (alpha x the mean plus a piece), while a
// routing just under lambda spills nothing and receives its whole load, so a run could
// exceed its plan. And every routing's sizes stay within the worst skew's reservation,
// foreign (lent) experts included: a helper's last piece of an expert can be a single
// copy, so the experts it holds are bounded by its load, not by min_spill-sized pieces
// (before, 3 where 2 were reserved: `train --seq-len 128 --cp 4` at 4 ranks measured
// 15.94 MiB of dispatch against a 15.19 MiB plan). That the estimate bounds each
// routing at its own imbalance is tests/schedules/moe_footprint_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/schedules/moe_plan.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The planner reserves for a skew: every routing up to it. A routing just under lambda
// does not spill, so it receives its whole load; the reservation at a skew past lambda
// must cover that too (not only the spilled load of alpha x the mean plus a piece):
// the estimate never shrinks as the skew grows.
TEST(DispatchReservation, ReservationGrowsWithTheSkew) {
  const MoeShape shape{8, 8, 16, 2};
  for (std::int64_t T : {16, 100, 1024, 5000})
    for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
      DispatchOptions o;  // alpha 1, lambda 1.3, min_spill 64
      DispatchSizes prev = dispatch_sizes_estimate(kind, shape, 4, T, 1.0, o);
      for (double skew = 1.01; skew <= 4.0; skew += 0.01) {
        const DispatchSizes s = dispatch_sizes_estimate(kind, shape, 4, T, skew, o);
        SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " T " + std::to_string(T) + " skew " + std::to_string(skew));
        EXPECT_GE(s.max_sent, prev.max_sent);
        EXPECT_GE(s.max_received, prev.max_received);
        EXPECT_GE(s.foreign, prev.foreign);
        EXPECT_GE(s.lent, prev.lent);
        prev = s;
      }
    }
}

// Random routings (Zipf-like expert weights of random steepness) of the trainer's
// toy sizes, where a rank's copies are few against min_spill: each rank's plan fits
// the reservation at the worst skew (EP), field by field.
TEST(DispatchReservation, WorstSkewCoversEveryRouting) {
  std::mt19937_64 rng(1);
  const int ep = 4, k = 2;
  const std::int64_t E = 8;
  int checked = 0;
  for (DispatchKind kind : {DispatchKind::llep, DispatchKind::pipelined_llep})
    for (std::int64_t T : {16, 32, 64})
      for (int trial = 0; trial < 300; ++trial) {
        std::uniform_real_distribution<double> u(0, 1);
        const double steep = 6 * u(rng);
        std::vector<double> w(static_cast<std::size_t>(E));
        for (double& x : w) x = std::pow(u(rng), steep);
        std::vector<std::int64_t> counts(static_cast<std::size_t>(ep * E), 0);
        for (int s = 0; s < ep; ++s)
          for (std::int64_t t = 0; t < T; ++t) {
            std::vector<double> left = w;
            for (int j = 0; j < k; ++j) {
              std::discrete_distribution<int> pick(left.begin(), left.end());
              const int e = pick(rng);
              left[static_cast<std::size_t>(e)] = 0;
              ++counts[static_cast<std::size_t>(s * E + e)];
            }
          }
        const DispatchOptions o;
        const MoePlan plan = make_moe_plan(kind, ep, E, counts, o);
        const DispatchSizes est = dispatch_sizes_estimate(kind, MoeShape{8, 8, E, k}, ep, T, ep, o);
        for (int r = 0; r < ep; ++r) {
          const DispatchSizes got = dispatch_sizes(plan, r, T);
          SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " T " + std::to_string(T) + " trial " +
                       std::to_string(trial) + " rank " + std::to_string(r) + " imbalance " +
                       std::to_string(plan.imbalance));
          EXPECT_LE(got.max_sent, est.max_sent);
          EXPECT_LE(got.max_received, est.max_received);
          EXPECT_LE(got.foreign, est.foreign);
          EXPECT_LE(got.lent, est.lent);
          ++checked;
        }
      }
  std::printf("%d rank plans within the worst skew's reservation\n", checked);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
