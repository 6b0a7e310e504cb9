#include "peakbound/schedules/checkpoint_policy.h"

#include <gtest/gtest.h>

#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t kB = 1 << 20;  // one boundary, already aligned

TEST(CheckpointPolicy, RingIsDepthPlusOneAndTheRestGoesToHost) {
  CheckpointPlacement p = place_sco(16, kB, 1, 0);
  EXPECT_EQ(p.ring_slots, 2);
  EXPECT_EQ(p.offloaded, 14);
  EXPECT_EQ(p.device_bytes(), 2 * kB);
  EXPECT_EQ(p.host_bytes(), 14 * kB);
  p = place_sco(16, kB, 4, 3);
  EXPECT_EQ(p.ring_slots, 5);
  EXPECT_EQ(p.offloaded, 8);
  EXPECT_EQ(p.device_bytes(), 8 * kB);
  // At the default depth two boundaries stay on the device whatever the stack's depth; at
  // depth 0 one.
  for (std::int64_t L : {2, 4, 7, 48}) EXPECT_EQ(place_sco(L, kB, 1, 0).device_bytes(), 2 * kB) << L;
  for (std::int64_t L : {1, 2, 4, 7, 48}) {
    EXPECT_EQ(place_sco(L, kB, 0, 0).device_bytes(), kB) << L;
    EXPECT_EQ(place_sco(L, kB, 0, 0).offloaded, L - 1) << L;
  }
}

TEST(CheckpointPolicy, FewLayersNeedNoMoreSlotsThanLayers) {
  for (std::int64_t L : {1, 2, 3, 5}) {
    CheckpointPlacement p = place_sco(L, kB, 4, 0);
    EXPECT_EQ(p.ring_slots, L);
    EXPECT_EQ(p.offloaded, 0);
    EXPECT_EQ(p.device_bytes(), place_all_resident(L, kB).device_bytes());
  }
  EXPECT_EQ(place_sco(5, kB, 1, 5).device_bytes(), 5 * kB);  // all resident: no ring
  EXPECT_EQ(place_sco(5, kB, 1, 5).ring_slots, 0);
}

TEST(CheckpointPolicy, BudgetKeepsAsManyResidentAsFit) {
  EXPECT_EQ(place_sco_within(16, kB, 1, 2 * kB).resident, 0);
  EXPECT_EQ(place_sco_within(16, kB, 1, 7 * kB + 5).resident, 5);
  EXPECT_EQ(place_sco_within(16, kB, 1, 7 * kB + 5).device_bytes(), 7 * kB);
  EXPECT_EQ(place_sco_within(16, kB, 1, 16 * kB).resident, 16);
  EXPECT_EQ(place_sco_within(16, kB, 1, 100 * kB).device_bytes(), 16 * kB);
  EXPECT_EQ(place_sco_within(2, kB, 3, 2 * kB).resident, 2);  // all fit, ring not needed
  EXPECT_THROW(place_sco_within(16, kB, 1, 2 * kB - 1), OutOfBudget);
  EXPECT_THROW(place_sco_within(16, kB, 2, 2 * kB), OutOfBudget);
}

TEST(CheckpointPolicy, ReductionMeetsTheTargetForEveryDepthAndLength) {
  for (std::int64_t D : {1, 2, 4})
    for (std::int64_t L = 1; L <= 64; ++L) {
      const double cut = 1.0 - static_cast<double>(place_sco(L, kB, D, 0).device_bytes()) /
                                   static_cast<double>(place_all_resident(L, kB).device_bytes());
      EXPECT_GE(cut, 1.0 - static_cast<double>(D + 1) / static_cast<double>(L) - 1e-12) << L << " " << D;
    }
}

TEST(CheckpointPolicy, BadInputsAreUserErrors) {
  EXPECT_THROW(place_sco(4, kB, -1, 0), InvalidArgument);
  EXPECT_THROW(place_sco(4, kB, 1, 5), InvalidArgument);
  EXPECT_THROW(place_sco(4, kB, 1, -1), InvalidArgument);
  EXPECT_EQ(arena_reserved(1), 256u);
  EXPECT_EQ(place_sco(4, 1000, 1, 0).boundary_bytes, 1024u);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
