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
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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
  o = {};
  o.max_lent = -1;
  expect_refused(o, "moe dispatch max_lent");
  // A huge but finite alpha is no overflow: every rank's capacity is all the copies.
  o = {};
  o.alpha = 1e300;
  o.lambda = 0;
  EXPECT_NO_THROW(make_moe_plan(DispatchKind::llep, 2, 2, counts, o));
}

// A linear stand-in for dispatch_peak_bytes: per row sent / received (x2 when the
// exchange is double-buffered), per lent expert held and lent out.
std::uint64_t linear_bytes(const DispatchSizes& z) {
  const std::uint64_t x = z.double_buffered ? 2 : 1;
  return x * (100 * static_cast<std::uint64_t>(z.max_sent) + 300 * static_cast<std::uint64_t>(z.max_received)) +
         1000 * static_cast<std::uint64_t>(z.foreign) + 10 * static_cast<std::uint64_t>(z.lent);
}

std::uint64_t worst_bytes(const MoePlan& p) {
  std::uint64_t b = 0;
  for (int r = 0; r < p.ep; ++r) b = std::max(b, linear_bytes(p.sizes(r, 0)));
  return b;
}

std::vector<std::int64_t> random_counts(std::mt19937_64& rng, int ep, std::int64_t E, int trial) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(ep * E));
  std::uniform_int_distribution<std::int64_t> n(0, trial % 2 ? 5 : 300);
  for (auto& c : counts) c = n(rng);
  if (trial % 3 == 0)  // hot: everything to rank 0's experts
    for (int s = 0; s < ep; ++s)
      for (std::int64_t e = E / ep; e < E; ++e) counts[static_cast<std::size_t>(s * E + e)] = 0;
  return counts;
}

TEST(MoePlan, RoundBytesDecideTheRounds) {
  std::mt19937_64 rng(9);
  for (int ep : {1, 2, 3, 4}) {
    const std::int64_t E = 4 * ep;
    for (int trial = 0; trial < 12; ++trial) {
      const std::vector<std::int64_t> counts = random_counts(rng, ep, E, trial);
      for (std::uint64_t budget : {20000ull, 60000ull, 250000ull, 4000000ull}) {
        SCOPED_TRACE("ep " + std::to_string(ep) + " trial " + std::to_string(trial) + " budget " + std::to_string(budget));
        DispatchOptions o = with_cap(1);  // ignored under round_bytes
        o.round_bytes = budget;
        MoePlan p;
        try {
          p = make_moe_plan(DispatchKind::pipelined_llep, ep, E, counts, o, linear_bytes);
        } catch (const InvalidArgument& e) {
          // Only when even one copy per source per round is over the budget.
          EXPECT_NE(std::string(e.what()).find("is too small: one copy per source per round needs"), std::string::npos)
              << e.what();
          EXPECT_LE(budget, 60000u) << "only the small budgets can be too small here";
          continue;
        }
        EXPECT_LE(worst_bytes(p), budget);  // every rank fits
        std::int64_t most = 0;
        for (int s = 0; s < ep; ++s) {
          std::int64_t n = 0;
          for (int d = 0; d < ep; ++d) {
            n += p.block_size(s, d);
            EXPECT_EQ(p.slice_begin(s, d, 0), 0);
            EXPECT_EQ(p.slice_begin(s, d, p.rounds), p.block_size(s, d));
          }
          most = std::max(most, n);
          // Full rounds: min(c, what is left) copies each.
          std::int64_t left = n;
          for (int i = 0; i < p.rounds; ++i) {
            EXPECT_EQ(p.sent(s, i), std::min(p.round_cap, left)) << "source " << s << " round " << i;
            left -= p.sent(s, i);
          }
        }
        if (most == 0) continue;
        EXPECT_EQ(p.rounds, most / p.round_cap + (most % p.round_cap != 0));
        // More memory never means more rounds.
        DispatchOptions twice = o;
        twice.round_bytes = 2 * budget;
        EXPECT_LE(make_moe_plan(DispatchKind::pipelined_llep, ep, E, counts, twice, linear_bytes).rounds, p.rounds);
        // A budget for everything at once: one round.
        DispatchOptions all = o;
        all.round_bytes = 1ull << 40;
        EXPECT_EQ(make_moe_plan(DispatchKind::pipelined_llep, ep, E, counts, all, linear_bytes).rounds, 1);
      }
    }
  }
}

TEST(MoePlan, BalancedRoutingRunsInFewLargeRounds) {
  // 4 ranks, 4096 copies each spread evenly: a budget for ~2000 rows a round gives 3
  // rounds where the default cap of 1024 gives 4, and a budget for everything one.
  std::vector<std::int64_t> counts(4 * 16, 256);
  DispatchOptions o;
  MoePlan by_cap = make_moe_plan(DispatchKind::pipelined_llep, 4, 16, counts, o);
  EXPECT_EQ(by_cap.rounds, 4);
  o.round_bytes = 2 * 2000 * 400;
  MoePlan by_bytes = make_moe_plan(DispatchKind::pipelined_llep, 4, 16, counts, o, linear_bytes);
  EXPECT_EQ(by_bytes.rounds, 3);
  EXPECT_LE(worst_bytes(by_bytes), o.round_bytes);
  EXPECT_GE(by_bytes.round_cap, 1900);
  o.round_bytes = 400 * 4096 + 1;
  EXPECT_EQ(make_moe_plan(DispatchKind::pipelined_llep, 4, 16, counts, o, linear_bytes).rounds, 1);
}

TEST(MoePlan, RoundBytesTooSmallForOneCopyIsRefusedByName) {
  std::vector<std::int64_t> counts(4, 3);
  DispatchOptions o;
  o.round_bytes = 799;  // one copy sent and received, double-buffered: 2 x (100 + 300)
  try {
    make_moe_plan(DispatchKind::pipelined_llep, 2, 2, counts, o, linear_bytes);
    ADD_FAILURE() << "accepted a budget below one copy per round";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("moe dispatch round_bytes 799 is too small"), std::string::npos) << e.what();
  }
  // LLEP and standard EP run in one round whatever the budget.
  EXPECT_EQ(make_moe_plan(DispatchKind::llep, 2, 2, counts, o, linear_bytes).rounds, 1);
}

TEST(MoePlan, MaxLentBoundsTheForeignExpertsOfEveryRank) {
  std::mt19937_64 rng(13);
  for (int ep : {2, 3, 4, 8}) {
    const std::int64_t E = 4 * ep;
    for (int trial = 0; trial < 12; ++trial) {
      const std::vector<std::int64_t> counts = random_counts(rng, ep, E, trial);
      for (std::int64_t bound : {1, 2, 3}) {
        SCOPED_TRACE("ep " + std::to_string(ep) + " trial " + std::to_string(trial) + " max_lent " + std::to_string(bound));
        DispatchOptions o = with_cap(64);
        o.lambda = 1.0;  // always spill
        o.max_lent = bound;
        for (DispatchKind k : {DispatchKind::llep, DispatchKind::pipelined_llep}) {
          const MoePlan p = make_moe_plan(k, ep, E, counts, o);
          for (int r = 0; r < ep; ++r) EXPECT_LE(static_cast<std::int64_t>(p.foreign_experts(r).size()), bound);
          // Every copy of every expert placed exactly once, in order.
          for (std::int64_t e = 0; e < E; ++e) {
            std::int64_t at = 0;
            for (const MoePlan::Piece& pc : p.pieces[static_cast<std::size_t>(e)]) {
              EXPECT_EQ(pc.begin, at);
              EXPECT_GT(pc.end, pc.begin);
              at = pc.end;
            }
            EXPECT_EQ(at, p.load[static_cast<std::size_t>(e)]);
          }
          expect_valid(p, 64);
        }
      }
    }
  }
  // Unbounded, rank 0's experts of loads 5000, 5000, 2000 go to helpers 1 and 3 twice.
  std::vector<std::int64_t> hot(4 * 12, 0);
  for (int s = 0; s < 4; ++s) {
    hot[static_cast<std::size_t>(s * 12)] = hot[static_cast<std::size_t>(s * 12 + 1)] = 1250;
    hot[static_cast<std::size_t>(s * 12 + 2)] = 500;
  }
  DispatchOptions o;
  const MoePlan free = make_moe_plan(DispatchKind::llep, 4, 12, hot, o);
  std::size_t most = 0;
  for (int r = 0; r < 4; ++r) most = std::max(most, free.foreign_experts(r).size());
  EXPECT_GT(most, 1u);
  o.max_lent = 1;
  const MoePlan one = make_moe_plan(DispatchKind::llep, 4, 12, hot, o);
  for (int r = 0; r < 4; ++r) EXPECT_LE(one.foreign_experts(r).size(), 1u);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
