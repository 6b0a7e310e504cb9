// The planner's dispatch reservation at a routing skew covers every routing up to it
// (the planner and `train`'s printed plan reserve for a skew, by default the worst):
// dispatch_sizes_estimate never shrinks as the skew grows. Before, a skew past LLEP's
// lambda reserved only the spilled load (alpha x the mean plus a piece), while a
// routing just under lambda spills nothing and receives its whole load, so a run could
// exceed its plan. That the estimate bounds each routing at its own imbalance is
// tests/schedules/moe_footprint_test.cc's.
#include <gtest/gtest.h>

#include <string>

#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/schedules/moe_plan.h"

namespace peakbound {
namespace {

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

}  // namespace
}  // namespace peakbound
