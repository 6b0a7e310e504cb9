// The dispatch harness's problem generator: the zipf sampler draws k distinct experts in
// bounded time for any finite exponent (issue 17: s = 40 and beyond never finished, 20
// took seconds), and a non-finite or negative exponent is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "peakbound/core/error.h"
#include "peakbound/verify/moe_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

MoeProblemSpec zipf(double s, std::int64_t experts, std::int64_t top_k) {
  MoeProblemSpec p;
  p.shape = MoeShape{4, 4, experts, top_k};
  p.ranks = 1;
  p.tokens = 200;
  p.skew = Skew::zipf;
  p.zipf_s = s;
  return p;
}

TEST(MoeProblem, ZipfFinishesForHugeExponents) {
  for (double s : {0.0, 1.2, 20.0, 40.0, 1e19, 1e30, std::numeric_limits<double>::max()})
    for (auto [E, K] : {std::pair<std::int64_t, std::int64_t>{16, 2}, {8, 8}, {64, 7}}) {
      SCOPED_TRACE("s " + std::to_string(s) + " E " + std::to_string(E) + " K " + std::to_string(K));
      MoeProblem p = make_moe_problem(zipf(s, E, K));
      for (std::int64_t t = 0; t < 200; ++t) {
        std::vector<std::int32_t> ids(p.ids.begin() + t * K, p.ids.begin() + (t + 1) * K);
        std::sort(ids.begin(), ids.end());
        EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "token " << t;
        EXPECT_GE(ids.front(), 0);
        EXPECT_LT(ids.back(), E);
      }
      if (s >= 40) {
        EXPECT_TRUE(std::find(p.ids.begin(), p.ids.begin() + K, 0) != p.ids.begin() + K) << "the head expert dominates";
      }
    }
}

TEST(MoeProblem, ZipfExponentMustBeFiniteAndNonNegative) {
  for (double s : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), -1.0}) {
    try {
      make_moe_problem(zipf(s, 16, 2));
      ADD_FAILURE() << "accepted zipf_s " << s;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("zipf_s"), std::string::npos) << e.what();
    }
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
