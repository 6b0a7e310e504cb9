// `peakbound bench checkpoint` and `peakbound verify checkpoint` as a user runs them:
// one JSON object with the fields the issue asks for, and one-line errors.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::CliRun;
CliRun run(const std::string& args) { return peakbound::testing::run_cli(args); }

// run_cli runs under `timeout`: a hang fails the test (exit 124) instead of stalling the suite.
CliRun run_bounded(const std::string& args, int seconds) { return peakbound::testing::run_cli(args, seconds); }

TEST(CheckpointCli, BenchPrintsBothSchedulesInOneJson) {
  CliRun r = run("bench checkpoint --layers 6 --tokens 64 --hidden 32 --warmup 0 --reps 1 --sweep --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["name"], "resident");
  EXPECT_EQ(j["runs"][1]["name"], "sco");
  for (const auto& run : j["runs"])
    for (const char* k : {"checkpoint_peak_bytes", "device_peak_bytes", "host_peak_bytes", "seconds", "tokens_per_second"})
      EXPECT_TRUE(run.contains(k)) << k;
  EXPECT_TRUE(j["bitwise_equal"].get<bool>());
  // 6 boundaries resident vs a ring of 2: two thirds less.
  EXPECT_DOUBLE_EQ(j["checkpoint_peak_reduction"].get<double>(), 1.0 - 2.0 / 6.0);
  EXPECT_GT(j["runs"][1]["host_peak_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(j.contains("throughput_ratio"));
  EXPECT_TRUE(j.contains("copy_engine_busy_fraction"));
  EXPECT_FALSE(j["link_emulation"]["enabled"].get<bool>());
  EXPECT_TRUE(j.contains("machine"));
  ASSERT_EQ(j["sweep"].size(), 7u);
  for (const auto& s : j["sweep"]) EXPECT_TRUE(s["target_met"].get<bool>() && s["bitwise_equal"].get<bool>()) << s.dump();
}

TEST(CheckpointCli, LinkEmulationIsLabelled) {
  CliRun r = run("bench checkpoint --layers 4 --tokens 32 --hidden 16 --warmup 0 --reps 1 --link-gbps 0.5 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["link_emulation"]["enabled"].get<bool>());
  EXPECT_DOUBLE_EQ(j["link_emulation"]["gbytes_per_second"].get<double>(), 0.5);
  EXPECT_TRUE(j["throughput_target_met"].is_null());  // the 0.95 target is for the real copy engine
}

TEST(CheckpointCli, VerifyPassesAndBadFlagsAreOneLine) {
  CliRun v = run("verify checkpoint --tokens 16 --hidden 8");
  EXPECT_EQ(v.code, 0) << v.err << v.out;
  EXPECT_NE(v.out.find("0 failed"), std::string::npos) << v.out;
  for (const char* bad : {"--resident-layers 9 --layers 4", "--checkpoint-budget 1KiB --tokens 64 --hidden 32",
                          "--link-gbps -1", "--prefetch -1"}) {
    CliRun r = run(std::string("bench checkpoint --reps 1 --warmup 0 ") + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_LT(r.code, 128) << bad;
    EXPECT_EQ(r.err.rfind("peakbound: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// Issue 17: an emulated link of one byte a second made `verify checkpoint` sleep for
// hours. Link speeds below 0.001 GB/s are refused at once, naming the flag.
TEST(CheckpointCli, AbsurdlySlowLinksAreRefusedNotSlept) {
  for (const char* cmd : {"verify checkpoint --link-gbps 1e-9", "verify checkpoint --link-gbps 0.0005",
                          "bench checkpoint --layers 4 --tokens 32 --hidden 16 --reps 1 --warmup 0 --link-gbps 1e-9"}) {
    CliRun r = run_bounded(cmd, 60);
    peakbound::testing::expect_one_line_error(r, "--link-gbps must be 0 (off) or an emulated bandwidth of at least 0.001");
  }
  // The slowest accepted link still finishes: 4 KiB boundaries at 1 MB/s are ~4 ms a copy.
  CliRun ok = run_bounded("bench checkpoint --layers 5 --tokens 32 --hidden 32 --reps 1 --warmup 0 --link-gbps 0.001 --json", 60);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(nlohmann::json::parse(ok.out)["bitwise_equal"].get<bool>());
}

// Issue 17: `--device-memory 0` silently meant automatic; automatic is `auto`, the default
// (auto_device_budget: above its 8 MiB reserve).
TEST(CheckpointCli, ZeroDeviceMemoryIsRefused) {
  CliRun r = run_bounded("bench checkpoint --layers 2 --tokens 16 --hidden 8 --reps 1 --warmup 0 --device-memory 0", 60);
  peakbound::testing::expect_one_line_error(r, "--device-memory must be positive, or auto");
  CliRun ok = run_bounded("bench checkpoint --layers 2 --tokens 16 --hidden 8 --reps 1 --warmup 0 --json", 60);
  ASSERT_EQ(ok.code, 0) << ok.err;
  const auto budget = nlohmann::json::parse(ok.out)["runs"][0]["device_budget_bytes"].get<std::uint64_t>();
  EXPECT_GT(budget, 8u << 20);
  CliRun as =
      run_bounded("bench checkpoint --layers 2 --tokens 16 --hidden 8 --reps 1 --warmup 0 --json --device-memory auto", 60);
  ASSERT_EQ(as.code, 0) << as.err;
  EXPECT_EQ(nlohmann::json::parse(as.out)["runs"][0]["device_budget_bytes"].get<std::uint64_t>(), budget);
}

// Issue 17: `--resident-layers -5` was taken as automatic while 1000 was refused.
// Every negative is refused now; automatic is the flag's absence.
TEST(CheckpointCli, NegativeResidentLayersAreRefused) {
  for (const char* k : {"-5", "-1"}) {
    CliRun r = run_bounded(std::string("bench checkpoint --layers 4 --tokens 16 --hidden 8 --reps 1 --warmup 0 "
                                       "--resident-layers ") + k, 60);
    peakbound::testing::expect_one_line_error(r, "--resident-layers must be an integer in [0");
  }
  CliRun big = run_bounded("bench checkpoint --layers 4 --tokens 16 --hidden 8 --reps 1 --warmup 0 --resident-layers 1000", 60);
  peakbound::testing::expect_one_line_error(big, "--resident-layers must be between 0 and the layer count 4");
  CliRun ok = run_bounded("bench checkpoint --layers 4 --tokens 16 --hidden 8 --reps 1 --warmup 0 --resident-layers 4 --json", 60);
  ASSERT_EQ(ok.code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["config"]["resident_layers_flag"].get<int>(), 4);
  EXPECT_EQ(j["runs"][1]["placement"]["offloaded_layers"].get<int>(), 0);
}

}  // namespace PB_TEST_FILE
}  // namespace

