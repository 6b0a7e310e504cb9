// `peakbound bench all`: runs the chosen benches as their own jobs and reports each figure
// beside its bar, with the layout; a bench name it does not know is a one-line error.
#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {

TEST(CliBenchAll, DispatchOnTwoRanksAsJson) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a full dispatch benchmark: too slow under the sanitizers (the release suite runs it)";
#endif
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const testing::CliRun r = testing::run_cli("bench all --ranks 2 --benches dispatch --json", 600);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("layout").at("ranks"), 2);
  EXPECT_TRUE(j.at("results").contains("dispatch"));
  EXPECT_FALSE(j["results"].contains("vocab"));
  int rows = 0;
  for (const nlohmann::json& f : j.at("figures")) {
    EXPECT_EQ(f.at("bench"), "dispatch");
    ASSERT_TRUE(f.at("value").is_number()) << f.dump();
    if (f.contains("at_least")) EXPECT_EQ(f.at("met").get<bool>(), f["value"].get<double>() >= f["at_least"].get<double>());
    ++rows;
  }
  EXPECT_GE(rows, 4);
  // A figure is the bench's own number, not a copy.
  EXPECT_EQ(j["figures"][0]["value"], j["results"]["dispatch"]["skews"]["hot"]["peak_reduction_vs_standard"]);
}

TEST(CliBenchAll, UnknownBenchIsAOneLineError) {
  testing::expect_one_line_error(testing::run_cli("bench all --benches vocab,nope"), "nope");
  testing::expect_one_line_error(testing::run_cli("bench all --benches reach"), "reach");
}

}  // namespace
}  // namespace peakbound
