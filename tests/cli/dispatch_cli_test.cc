// `bench dispatch` / `verify dispatch` as a user runs them, each under a timeout so a
// hang fails instead of stalling the suite (issue 17): caps smaller than the number of
// ranks, huge zipf exponents, non-finite knobs, and the device budget.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::CliRun;
using peakbound::testing::expect_one_line_error;

// The binary under `timeout`, optionally under mpirun with `ranks` processes.
CliRun run_timed(const std::string& args, int seconds = 120, int ranks = 0) {
  return ranks > 0 ? peakbound::testing::run_mpi(args, ranks, seconds) : peakbound::testing::run_cli(args, seconds);
}

using peakbound::testing::have_mpirun;

TEST(DispatchCli, CapSmallerThanTheRanksFinishes) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  CliRun v2 = run_timed("verify dispatch --cap 1 --tokens 12 --skew uniform,hot", 120, 2);
  EXPECT_EQ(v2.code, 0) << v2.out << v2.err;  // 124: timed out
  EXPECT_NE(v2.out.find("verify dispatch: pass"), std::string::npos) << v2.out;
  CliRun v3 = run_timed("verify dispatch --cap 2 --tokens 12 --experts 6 --skew uniform,source", 120, 3);
  EXPECT_EQ(v3.code, 0) << v3.out << v3.err;
  EXPECT_NE(v3.out.find("verify dispatch: pass"), std::string::npos) << v3.out;
  CliRun b = run_timed("bench dispatch --cap 1 --tokens 8 --hidden 8 --ffn 8 --reps 1 --json", 120, 2);
  EXPECT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("\"pipelined_llep\""), std::string::npos) << b.out;
}

TEST(DispatchCli, HugeZipfExponentsFinish) {
  for (const char* s : {"40", "1e19", "1e30"}) {
    CliRun r = run_timed(std::string("verify dispatch --skew zipf --tokens 40 --zipf-s ") + s, 60);
    EXPECT_EQ(r.code, 0) << s << ": " << r.out << r.err;
    EXPECT_NE(r.out.find("verify dispatch: pass"), std::string::npos) << r.out;
  }
  CliRun b = run_timed("bench dispatch --skew zipf --zipf-s 1e30 --tokens 64 --hidden 8 --ffn 8 --reps 1 --json", 60);
  EXPECT_EQ(b.code, 0) << b.out << b.err;
}

TEST(DispatchCli, NonFiniteKnobsAreRefused) {
  for (const char* cmd : {"verify dispatch", "bench dispatch"}) {
    expect_one_line_error(run_timed(std::string(cmd) + " --zipf-s inf", 30), "--zipf-s");
    expect_one_line_error(run_timed(std::string(cmd) + " --zipf-s nan", 30), "--zipf-s");
    expect_one_line_error(run_timed(std::string(cmd) + " --alpha nan", 30), "--alpha");
    expect_one_line_error(run_timed(std::string(cmd) + " --lambda nan", 30), "--lambda");
    expect_one_line_error(run_timed(std::string(cmd) + " --cap 0", 30), "--cap");
  }
}

TEST(DispatchCli, DeviceBudgetFromTheFootprintOrTheFlag) {
  CliRun b = run_timed("bench dispatch --tokens 64 --hidden 8 --ffn 8 --reps 1 --json", 60);
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("\"device_budget_bytes\""), std::string::npos) << b.out;
  expect_one_line_error(run_timed("bench dispatch --tokens 64 --hidden 8 --ffn 8 --reps 1 --device-memory 4KiB", 60),
                        "budget");
  expect_one_line_error(run_timed("verify dispatch --device-memory 12parsecs", 30), "--device-memory");
  CliRun v = run_timed("verify dispatch --tokens 16 --device-memory 8MiB", 60);
  EXPECT_EQ(v.code, 0) << v.out << v.err;
}

TEST(DispatchCli, RoundBudgetAndMaxLent) {
  for (const char* cmd : {"verify dispatch", "bench dispatch"}) {
    expect_one_line_error(run_timed(std::string(cmd) + " --round-budget 12parsecs", 30), "--round-budget");
    expect_one_line_error(run_timed(std::string(cmd) + " --round-budget 0", 30), "--round-budget");
    expect_one_line_error(run_timed(std::string(cmd) + " --round-budget 1KiB", 30), "--round-budget 1KiB is below one copy");
    expect_one_line_error(run_timed(std::string(cmd) + " --max-lent -1", 30), "--max-lent");
  }
  CliRun v = run_timed("verify dispatch --tokens 40 --round-budget 256KiB --max-lent 1 --skew uniform,hot", 60);
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("verify dispatch: pass"), std::string::npos) << v.out;
  CliRun b = run_timed("bench dispatch --tokens 256 --hidden 8 --ffn 8 --reps 1 --round-budget 64KiB --json", 60);
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("\"round_bytes\": 65536"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("\"round_cap\""), std::string::npos) << b.out;
}

TEST(DispatchCli, HelpSaysWhereDefaultsComeFrom) {
  CliRun b = run_timed("bench dispatch --help", 30);
  EXPECT_EQ(b.code, 0);
  EXPECT_NE(b.out.find("1024"), std::string::npos) << b.out;  // DispatchOptions{}.cap
  CliRun v = run_timed("verify dispatch --help", 30);
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("verify problem size"), std::string::npos) << v.out;
}

TEST(DispatchCli, RunsUnderTwoGigabytesOfAddressSpace) {
  if (!peakbound::testing::address_space_limits_apply()) GTEST_SKIP() << "sanitizer build: ulimit -v cannot apply";
  // Was: a fixed 64 GiB (bench) / 16 GiB (verify) reservation, so `ulimit -v 2G` failed
  // even tiny shapes; the budget now comes from the footprints.
  const long kib = 2l << 20;
  CliRun v = peakbound::testing::run_limited("verify dispatch --skew uniform,hot", kib);
  EXPECT_EQ(v.code, 0) << v.err;
  CliRun b = peakbound::testing::run_limited("bench dispatch --tokens 64 --reps 1 --json", kib);
  EXPECT_EQ(b.code, 0) << b.err;
}

}  // namespace PB_TEST_FILE
}  // namespace
