// The CLI's flag kinds (cli/flags.h) in-process, fed every value of the careless list
// the flag sweep (flag_sweep_test.cc) gives each command's flags only a few of: each is
// refused with an error naming the flag, the target keeps its default, and a flag with
// an old name (--seq-len,--context) names its first name whichever is given.
#include "peakbound/cli/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace peakbound::cli {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Values {
  std::int64_t tokens = 64;
  int reps = 3;
  double lr = 0.5;
  float z = 0.25f;
  std::uint64_t seed = 7;
  std::string name = "x";
};

struct TestCli {
  CLI::App root{"test"};
  Values v;
  TestCli() {
    int_flag(&root, "--seq-len,--tokens", v.tokens, "tokens", 1, 1 << 20);
    int_flag(&root, "--reps", v.reps, "reps", 1, 100);
    real_flag(&root, "--lr", v.lr, "learning rate", 0.0, 1.0);
    real_flag(&root, "--z", v.z, "z-loss", 0.0, 1.0);
    seed_flag(&root, "--seed", v.seed, "seed");
    text_flag(&root, "--name", v.name, "a name");
  }
};

// The error of parsing `args` (empty: it parsed), with the values after it.
std::string error_of(const std::vector<std::string>& args, Values* after = nullptr) {
  TestCli c;
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes them reversed
  std::string err;
  try {
    c.root.parse(rev);
  } catch (const CLI::ParseError& e) {
    err = e.what();
    if (err.empty()) err = "(empty error)";
  }
  if (after) *after = c.v;
  return err;
}

TEST(CliFlags, EveryCarelessValueIsRefusedNamingTheFlag) {
  const std::vector<std::string> careless = {"nan", "inf", "-inf", "abc", "", "1x", "-99999999999999999999",
                                             "99999999999999999999", "1e300", "0x10"};
  for (const char* flag : {"--seq-len", "--reps", "--lr", "--z", "--seed"})
    for (const std::string& v : careless) {
      SCOPED_TRACE(std::string(flag) + " '" + v + "'");
      Values after;
      const std::string err = error_of({flag, v}, &after);
      EXPECT_NE(err.find(flag), std::string::npos) << err;
      EXPECT_EQ(err.find('\n'), std::string::npos) << err;
      EXPECT_EQ(after.tokens, 64);
      EXPECT_EQ(after.reps, 3);
      EXPECT_EQ(after.lr, 0.5);
      EXPECT_EQ(after.z, 0.25f);
      EXPECT_EQ(after.seed, 7u);
    }
  // Integers refuse fractions; a seed refuses -1 (no wrap to 2^64 - 1); in-range reals parse.
  for (const char* flag : {"--seq-len", "--reps", "--seed"}) EXPECT_NE(error_of({flag, "1.5"}).find(flag), std::string::npos);
  EXPECT_NE(error_of({"--seed", "-1"}).find("--seed"), std::string::npos);
  EXPECT_NE(error_of({"--name", ""}), "");
  Values ok;
  EXPECT_EQ(error_of({"--lr", "1e-3", "--z", "1", "--seed", "18446744073709551615", "--reps", "100"}, &ok), "");
  EXPECT_EQ(ok.lr, 1e-3);
  EXPECT_EQ(ok.z, 1.0f);
  EXPECT_EQ(ok.seed, 18446744073709551615u);
  EXPECT_EQ(ok.reps, 100);
}

TEST(CliFlags, AnOldNameSetsTheSameFlagAndErrorsNameTheNewOne) {
  Values v;
  EXPECT_EQ(error_of({"--tokens", "4096"}, &v), "");
  EXPECT_EQ(v.tokens, 4096);
  EXPECT_EQ(error_of({"--seq-len", "128"}, &v), "");
  EXPECT_EQ(v.tokens, 128);
  const std::string err = error_of({"--tokens", "0"});
  EXPECT_NE(err.find("--seq-len"), std::string::npos) << err;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cli
