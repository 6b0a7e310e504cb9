// `peakbound bench all`: runs the chosen benches as their own jobs and reports each figure
// beside its bar, with the layout; a bench name it does not know is a one-line error.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(CliBenchAll, DispatchOnTwoRanksAsJson) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a full dispatch benchmark: too slow under the sanitizers (the release suite runs it)";
#endif
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const testing::CliRun r = testing::run_cli("bench all --ranks 2 --benches dispatch --repeat 2 --json", 900);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("layout").at("ranks"), 2);
  EXPECT_TRUE(j.at("results").contains("dispatch"));
  EXPECT_FALSE(j["results"].contains("vocab"));
  int rows = 0;
  for (const nlohmann::json& f : j.at("figures")) {
    EXPECT_EQ(f.at("bench"), "dispatch");
    ASSERT_TRUE(f.at("value").is_number()) << f.dump();
    // Two runs: the median is the lower of the two, the spread is both, and a bar is met
    // only when it is met in both runs.
    const nlohmann::json& v = f.at("values");
    ASSERT_EQ(v.size(), 2u) << f.dump();
    const double lo = std::min(v[0].get<double>(), v[1].get<double>()), hi = std::max(v[0].get<double>(), v[1].get<double>());
    EXPECT_EQ(f["value"].get<double>(), lo);
    EXPECT_EQ(f["min"].get<double>(), lo);
    EXPECT_EQ(f["max"].get<double>(), hi);
    if (f.contains("at_least")) {
      const double bar = f["at_least"].get<double>();
      EXPECT_EQ(f["met_runs"].get<int>(), (v[0].get<double>() >= bar) + (v[1].get<double>() >= bar));
      EXPECT_EQ(f.at("met").get<bool>(), lo >= bar);
    }
    ++rows;
  }
  EXPECT_GE(rows, 4);
  ASSERT_EQ(j.at("runs").size(), 2u);
  EXPECT_EQ(j.at("layout").at("repeat"), 2);
  // A figure is the bench's own number, not a copy.
  EXPECT_EQ(j["figures"][0]["values"][0], j["runs"][0]["dispatch"]["skews"]["hot"]["peak_reduction_vs_standard"]);
  EXPECT_EQ(j["figures"][0]["values"][1], j["runs"][1]["dispatch"]["skews"]["hot"]["peak_reduction_vs_standard"]);
  EXPECT_EQ(j["results"], j["runs"][0]);
}

TEST(CliBenchAll, UnknownBenchIsAOneLineError) {
  testing::expect_one_line_error(testing::run_cli("bench all --benches vocab,nope"), "nope");
  testing::expect_one_line_error(testing::run_cli("bench all --benches reach"), "reach");
  testing::expect_one_line_error(testing::run_cli("bench all --repeat 0"), "--repeat");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
