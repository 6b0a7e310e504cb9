// make_moe_plan on its own (no communicator): the round slicing of PipelinedLLEP keeps
// every source at or under the cap in every round, for caps smaller than the number of
// ranks too (issue 17: the round count used to grow forever when cap < EP), slices
// cover each block exactly once, and the options are checked by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/schedules/moe_plan.h"

namespace peakbound {
namespace {

DispatchOptions with_cap(std::int64_t cap) {
  DispatchOptions o;
  o.cap = cap;
  o.min_spill = 2;
  return o;
}

void expect_valid(const MoePlan& p, std::int64_t cap) {
  std::int64_t most = 0;
  for (int s = 0; s < p.ep; ++s) {
    std::int64_t n = 0;
    for (int d = 0; d < p.ep; ++d) {
      n += p.block_size(s, d);
      EXPECT_EQ(p.slice_begin(s, d, 0), 0);
      EXPECT_EQ(p.slice_begin(s, d, p.rounds), p.block_size(s, d));
      for (int i = 0; i < p.rounds; ++i) EXPECT_GE(p.slice(s, d, i), 0);
    }
    most = std::max(most, n);
    if (p.kind == DispatchKind::pipelined_llep) {
      for (int i = 0; i < p.rounds; ++i) EXPECT_LE(p.sent(s, i), cap) << "source " << s << " round " << i;
    }
  }
  if (p.kind == DispatchKind::pipelined_llep) {
    EXPECT_EQ(p.rounds, std::max<std::int64_t>(1, most / cap + (most % cap != 0)));
    EXPECT_LE(p.max_sent(), cap);
  } else {
    EXPECT_EQ(p.rounds, 1);
  }
}

TEST(MoePlan, CapSmallerThanTheRanksFinishes) {
  // 2 ranks cap 1, 3 ranks cap 2: each source sends one copy to every rank.
  for (auto [ep, cap] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{3, 1}, std::pair{4, 3}, std::pair{8, 1}}) {
    const std::int64_t E = 2 * ep;
    std::vector<std::int64_t> counts(static_cast<std::size_t>(ep * E), 0);
    for (int s = 0; s < ep; ++s)
      for (int d = 0; d < ep; ++d) counts[static_cast<std::size_t>(s * E + 2 * d)] = 1;
    for (DispatchKind k : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
      SCOPED_TRACE("ep " + std::to_string(ep) + " cap " + std::to_string(cap) + " " + std::string(dispatch_kind_name(k)));
      MoePlan p = make_moe_plan(k, ep, E, counts, with_cap(cap));
      expect_valid(p, cap);
    }
  }
}

TEST(MoePlan, RandomCountsEveryCapStaysUnderTheCap) {
  std::mt19937_64 rng(5);
  for (int ep : {1, 2, 3, 4, 5}) {
    const std::int64_t E = 3 * ep;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::int64_t> counts(static_cast<std::size_t>(ep * E));
      std::uniform_int_distribution<std::int64_t> small(0, trial % 2 ? 3 : 40);
      for (auto& c : counts) c = small(rng);
      if (trial % 3 == 0)  // all copies to rank 0's experts
        for (int s = 0; s < ep; ++s)
          for (std::int64_t e = 3; e < E; ++e) counts[static_cast<std::size_t>(s * E + e)] = 0;
      for (std::int64_t cap : {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{7}, std::int64_t{64},
                                 std::numeric_limits<std::int64_t>::max()})
        for (DispatchKind k : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
          SCOPED_TRACE("ep " + std::to_string(ep) + " trial " + std::to_string(trial) + " cap " + std::to_string(cap) +
                       " " + std::string(dispatch_kind_name(k)));
          expect_valid(make_moe_plan(k, ep, E, counts, with_cap(cap)), cap);
        }
    }
  }
}

TEST(MoePlan, SlicesAreNearProportional) {
  // One source, blocks 90 / 9 / 1 over 10 rounds of 10: each round takes ~9 / ~1 / 0-1.
  std::vector<std::int64_t> counts(9, 0);
  counts[0] = 90, counts[3] = 9, counts[6] = 1;
  std::vector<std::int64_t> all(27, 0);
  std::copy(counts.begin(), counts.end(), all.begin());
  DispatchOptions o = with_cap(10);
  o.lambda = 1e9;  // no spilling: the blocks are the experts' loads
  MoePlan p = make_moe_plan(DispatchKind::pipelined_llep, 3, 9, all, o);
  ASSERT_EQ(p.rounds, 10);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(p.sent(0, i), 10);
    EXPECT_NEAR(static_cast<double>(p.slice(0, 0, i)), 9.0, 1.0);
    EXPECT_LE(p.slice(0, 1, i), 2);
    EXPECT_LE(p.slice(0, 2, i), 1);
  }
}

TEST(MoePlan, OptionsAreCheckedByName) {
  std::vector<std::int64_t> counts(4, 1);
  auto expect_refused = [&](DispatchOptions o, const std::string& needle) {
    try {
      make_moe_plan(DispatchKind::pipelined_llep, 2, 2, counts, o);
      ADD_FAILURE() << "accepted " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << "a library error names no CLI flag: " << e.what();
    }
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  DispatchOptions o;
  o.cap = 0;
  expect_refused(o, "moe dispatch cap must be positive");
  o = {};
  o.alpha = nan;
  expect_refused(o, "moe dispatch alpha");
  o.alpha = inf;
  expect_refused(o, "moe dispatch alpha");
  o.alpha = 0.5;
  expect_refused(o, "moe dispatch alpha");
  o = {};
  o.lambda = nan;
  expect_refused(o, "moe dispatch lambda");
  o.lambda = inf;
  expect_refused(o, "moe dispatch lambda");
  o = {};
  o.min_spill = 0;
  expect_refused(o, "moe dispatch min_spill");
  // A huge but finite alpha is no overflow: every rank's capacity is all the copies.
  o = {};
  o.alpha = 1e300;
  o.lambda = 0;
  EXPECT_NO_THROW(make_moe_plan(DispatchKind::llep, 2, 2, counts, o));
}

}  // namespace
}  // namespace peakbound
