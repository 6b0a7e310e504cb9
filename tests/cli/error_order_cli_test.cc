// The error line comes after what the command printed before failing, also when both
// streams go to one file (stdout is then fully buffered, stderr is not): the banner and
// the plan first, then the refusal that explains them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(CliErrorOrder, TheErrorLineComesAfterTheBannerInOneFile) {
  const std::string file = ::testing::TempDir() + "/pb_error_order.txt";
  const testing::CliRun r = testing::run_cli(
      "", 120,
      "sh -c '" + std::string(PEAKBOUND_CLI_PATH) + " train --steps 1 --seq-len 32 --device-memory 1MiB >" + file +
          " 2>&1'");
  EXPECT_EQ(r.code, 1);
  const std::string text = testing::slurp(file);
  const std::size_t banner = text.find("peakbound train:"), plan = text.find("plan (per device"),
                    error = text.find("peakbound: error:");
  ASSERT_NE(banner, std::string::npos) << text;
  ASSERT_NE(plan, std::string::npos) << text;
  ASSERT_NE(error, std::string::npos) << text;
  EXPECT_LT(banner, error) << text;
  EXPECT_LT(plan, error) << text;
  std::remove(file.c_str());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
