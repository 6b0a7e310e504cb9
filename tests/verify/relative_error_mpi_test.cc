// The distributed exactness metric: max over the whole tensor of |a - ref| over max|ref|,
// whichever rank holds the worst element; NaN on any rank is NaN, never a pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(GroupRelativeError, WorstElementOnTheLastRankCounts) {
  Communicator& w = testing::world();
  const int last = w.size() - 1;
  std::vector<float> ref(5), a(5);
  for (int i = 0; i < 5; ++i) ref[static_cast<std::size_t>(i)] = a[static_cast<std::size_t>(i)] = static_cast<float>(i - 2);
  if (w.rank() == 0) ref[4] = 8.0f, a[4] = 8.0f;  // the scale lives on rank 0
  if (w.rank() == last) a[1] += 0.5f;              // the error on the last rank
  EXPECT_DOUBLE_EQ(verify::group_relative_error(w, a.data(), ref.data(), 5), 0.5 / 8.0);
}

TEST(GroupRelativeError, ZeroReferenceGivesTheAbsoluteError) {
  Communicator& w = testing::world();
  std::vector<float> ref(3, 0.0f), a(3, 0.0f);
  if (w.rank() == 0) a[2] = 0.25f;
  EXPECT_DOUBLE_EQ(verify::group_relative_error(w, a.data(), ref.data(), 3), 0.25);
}

TEST(GroupRelativeError, NanOnAnyRankIsNan) {
  Communicator& w = testing::world();
  std::vector<float> ref(4, 1.0f), a(4, 1.0f);
  if (w.rank() == w.size() - 1) a[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(verify::group_relative_error(w, a.data(), ref.data(), 4)));
  std::vector<float> ref2(4, 1.0f), b(4, 1.0f);
  if (w.rank() == 0) ref2[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(verify::group_relative_error(w, b.data(), ref2.data(), 4)));
}

TEST(GroupRelativeError, EmptyPartsAreFine) {
  Communicator& w = testing::world();
  std::vector<float> ref(2, 2.0f), a(2, 2.0f);
  a[0] = 3.0f;
  const std::int64_t n = w.rank() == 0 ? 2 : 0;
  EXPECT_DOUBLE_EQ(verify::group_relative_error(w, a.data(), ref.data(), n), 0.5);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
