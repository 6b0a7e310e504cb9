// The zigzag context-parallel layout: every token held exactly once, rank i holds chunks i
// and 2CP-1-i, chunk lengths differ by at most one, local positions map to global ones, and
// causal attention work is equal on every rank when 2CP divides S (within a few rows of keys
// otherwise).
#include "peakbound/schedules/context_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(ContextLayout, EveryTokenOnceAndTheZigzagPairing) {
  for (int cp = 1; cp <= 8; ++cp)
    for (std::int64_t S : {0, 1, 5, 16, 17, 31, 64, 100, 1001, 4096}) {
      SCOPED_TRACE("S=" + std::to_string(S) + " cp=" + std::to_string(cp));
      std::vector<int> held(static_cast<std::size_t>(S), 0);
      std::int64_t lo = S, hi = 0;
      for (int r = 0; r < cp; ++r) {
        const CpShard s = zigzag_shard(S, cp, r);
        const CpChunk a = zigzag_chunk(S, cp, r), b = zigzag_chunk(S, cp, 2 * cp - 1 - r);
        EXPECT_EQ(s.first.begin, a.begin);
        EXPECT_EQ(s.second.begin, b.begin);
        EXPECT_LE(s.first.begin + s.first.len, s.second.begin);  // the early chunk first
        for (std::int64_t t = 0; t < s.tokens(); ++t) ++held[static_cast<std::size_t>(s.position(t))];
        lo = std::min({lo, a.len, b.len});
        hi = std::max({hi, a.len, b.len});
      }
      for (std::int64_t p = 0; p < S; ++p) EXPECT_EQ(held[static_cast<std::size_t>(p)], 1) << "position " << p;
      EXPECT_LE(hi - lo, 1);
    }
}

TEST(ContextLayout, CausalWorkIsBalanced) {
  for (int cp = 1; cp <= 8; ++cp)
    for (std::int64_t S : {16, 64, 96, 4096, 17, 1001, 4097}) {
      SCOPED_TRACE("S=" + std::to_string(S) + " cp=" + std::to_string(cp));
      std::int64_t lo = -1, hi = 0, total = 0;
      for (int r = 0; r < cp; ++r) {
        const std::int64_t w = causal_pairs(zigzag_shard(S, cp, r));
        lo = lo < 0 ? w : std::min(lo, w);
        hi = std::max(hi, w);
        total += w;
      }
      EXPECT_EQ(total, S * (S + 1) / 2);
      if (S % (2 * cp) == 0) {
        EXPECT_EQ(lo, hi);  // exactly equal
      } else {
        // A chunk's work is len (2 begin + len + 1) / 2: the uneven cut moves every chunk's
        // begin by less than 2CP and its length by at most one, so each rank's work moves by
        // less than 2 x (2CP x len + S) <= 4 (S + 2CP) pairs: a few rows of keys.
        EXPECT_LE(hi - lo, 4 * (S + 2 * cp));
      }
    }
  // The contiguous split it replaces is not balanced: the last rank does most of the work.
  const std::int64_t S = 4096;
  EXPECT_LT(causal_pairs({{0, S / 4}, {0, 0}}) * 3, causal_pairs({{3 * S / 4, S / 4}, {0, 0}}));
}

TEST(ContextLayout, BadArgumentsAreRefused) {
  EXPECT_THROW(zigzag_shard(10, 0, 0), InvalidArgument);
  EXPECT_THROW(zigzag_shard(10, 2, 2), InvalidArgument);
  EXPECT_THROW(zigzag_shard(10, 2, -1), InvalidArgument);
  EXPECT_THROW(zigzag_shard(-1, 2, 0), InvalidArgument);
  EXPECT_THROW(zigzag_chunk(10, 2, 4), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The widest shard is not always rank 0's: S = 7 over cp 2 gives chunks 2, 2, 2, 1, so
// rank 0 holds 2 + 1 and rank 1 holds 2 + 2.
TEST(ContextLayout, WidestShard) {
  EXPECT_EQ(zigzag_widest_rank(7, 2), 1);
  EXPECT_EQ(zigzag_widest_tokens(7, 2), 4);
  for (std::int64_t S : {8, 9, 15, 1001})
    for (int cp : {1, 2, 3, 4}) {
      std::int64_t most = 0;
      for (int r = 0; r < cp; ++r) most = std::max(most, zigzag_shard(S, cp, r).tokens());
      EXPECT_EQ(zigzag_widest_tokens(S, cp), most) << S << " " << cp;
      EXPECT_EQ(zigzag_shard(S, cp, zigzag_widest_rank(S, cp)).tokens(), most);
    }
}

// The shortest chunk over every rank's two: floor(S / 2 cp) (S = 7 over cp 2: 1).
TEST(ContextLayout, ShortestChunk) {
  EXPECT_EQ(zigzag_shortest_chunk(7, 2), 1);
  for (std::int64_t S : {8, 9, 15, 1001})
    for (int cp : {1, 2, 3, 4}) {
      std::int64_t fewest = S;
      for (int r = 0; r < cp; ++r) {
        const CpShard z = zigzag_shard(S, cp, r);
        fewest = std::min({fewest, z.first.len, z.second.len});
      }
      EXPECT_EQ(zigzag_shortest_chunk(S, cp), fewest) << S << " " << cp;
      EXPECT_EQ(zigzag_shortest_chunk(S, cp), S / (2 * cp));
    }
  EXPECT_THROW(zigzag_shortest_chunk(8, 0), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
