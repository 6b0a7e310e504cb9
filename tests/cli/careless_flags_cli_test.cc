// Flags a careless user gets wrong, each refused in one line that says what to do (issue
// 25): an eval context longer than the token file, a negative size, --task beside --data,
// and a flag given twice.
#include <cstdint>
#include <fstream>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::expect_one_line_error;
using testing::run_cli;

// A flat uint16 token file of n tokens (nanoGPT's format), every token in tiny-moe's vocabulary.
std::string token_file(const std::string& name, int n) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    const std::uint16_t t = static_cast<std::uint16_t>((i * 7919) % 16384);
    f.write(reinterpret_cast<const char*>(&t), 2);
  }
  return path;
}

TEST(CarelessFlagsCli, EvalContextLongerThanTheFileSaysHowManyTokensItHolds) {
  const std::string path = token_file("careless_eval.bin", 2000);
  const CliRun r = run_cli("eval --data " + path + " --context 100000", 60);
  expect_one_line_error(r, "holds 2000 tokens");
  EXPECT_NE(r.err.find("--context 100000"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--windows"), std::string::npos) << "blames a flag never given: " << r.err;
  // --windows given and too many: that one is still named.
  expect_one_line_error(run_cli("eval --data " + path + " --context 1000 --windows 5", 60), "--windows 5");
}

TEST(CarelessFlagsCli, NegativeSizesSayTheyCannotBeNegative) {
  for (const std::string& args : {std::string("train --device-memory -1"), std::string("bench reach --budget -1GiB"),
                                   std::string("bench all --reach-budget -0.5MiB")}) {
    const CliRun r = run_cli(args, 60);
    expect_one_line_error(r, "negative");
    EXPECT_EQ(r.err.find("not a number"), std::string::npos) << r.err;
  }
}

TEST(CarelessFlagsCli, TaskBesideDataIsRefused) {
  const std::string path = token_file("careless_train.bin", 4000);
  const CliRun r = run_cli("train --data " + path + " --task kv --steps 1 --seq-len 16", 60);
  expect_one_line_error(r, "--task kv");
  EXPECT_NE(r.err.find("--data"), std::string::npos) << r.err;
}

TEST(CarelessFlagsCli, AFlagGivenTwiceIsNamedWithItsValues) {
  CliRun r = run_cli("train --steps 10 --steps 20", 60);
  expect_one_line_error(r, "--steps given twice (10 and 20); give it once");
  EXPECT_EQ(r.code, 2);
  expect_one_line_error(run_cli("bench reach --budget 1 --budget 2 --budget=3", 60),
                        "--budget given 3 times (1, 2 and 3); give it once");
  expect_one_line_error(run_cli("eval --data a.bin --data b.bin", 60), "--data given twice (a.bin and b.bin)");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
