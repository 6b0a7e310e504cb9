// The optimizer benchmark on a small shard: the JSON carries every field the issue
// asks for, with values that follow from the run (bytes from the Arenas, stage
// times, bitwise equality), and the CLI prints it or a one-line error.
#include "peakbound/bench/optimizer_bench.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "peakbound/core/error.h"
#include "peakbound/schedules/optimizer_footprint.h"
#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

OptimizerBenchOptions small() {
  OptimizerBenchOptions o;
  o.params = 100003;
  o.bucket_bytes = 16 * 1024;
  o.threads = 2;
  o.warmup = 1;
  o.steps = 2;
  o.bandwidth_bytes = 1 << 20;
  return o;
}

TEST(OptimizerBench, JsonHasEveryFieldAndTheSchedulesAgree) {
  nlohmann::json j = run_optimizer_bench(small());
  EXPECT_TRUE(j["bitwise_equal"].get<bool>());
  ASSERT_EQ(j["runs"].size(), 3u);
  for (const char* k : {"speedup_stream_vs_serial", "pipeline_efficiency", "adam_params_per_second",
                        "memory_bandwidth_gbps", "roofline_fraction", "step_roofline_fraction"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
  EXPECT_LE(j["pipeline_efficiency"].get<double>(), 1.0);
  EXPECT_TRUE(j.contains("machine"));
  // Each schedule holds exactly its footprint: the device Arena's optimizer bytes and
  // the host's state and staging.
  const std::uint64_t state = 3 * 100003ull * 4;
  const OptimizerShape shape{100003, 2, 2, 4, 4, 4};
  OptimizerOptions oo;
  oo.bucket_bytes = small().bucket_bytes;
  for (const auto& r : j["runs"]) {
    const auto name = r["name"].get<std::string>();
    const Footprint f = optimizer_footprint(name, shape, oo);
    EXPECT_GT(r["step_seconds"].get<double>(), 0.0) << name;
    EXPECT_EQ(r["optimizer_device_bytes"].get<std::uint64_t>(), f.device_peak(Component::optimizer)) << name;
    EXPECT_EQ(r["host_optimizer_bytes"].get<std::uint64_t>(), f.host_peak(Component::optimizer)) << name;
    EXPECT_EQ(r["host_staging_bytes"].get<std::uint64_t>(), f.host_peak(Component::comm)) << name;
    if (name == "device") {
      EXPECT_EQ(r["optimizer_device_bytes"].get<std::uint64_t>(), 3 * arena_reserved(100003 * 4));
    } else {
      EXPECT_EQ(r["optimizer_device_bytes"].get<std::uint64_t>(), 0u) << name;
      EXPECT_GE(r["host_optimizer_bytes"].get<std::uint64_t>(), state) << name;
      EXPECT_LT(r["host_optimizer_bytes"].get<std::uint64_t>(), state + 16384) << name;
      for (const char* k : {"d2h_seconds", "update_seconds", "h2d_seconds"}) EXPECT_GT(r[k].get<double>(), 0.0) << name << k;
    }
    if (name == "offload_stream") {
      EXPECT_EQ(r["buckets"].get<int>(), 13);  // 100003 / 8192 rounded up
    }
  }
  EXPECT_EQ(j["bytes_per_param"]["update"].get<double>(), 28.0);
  EXPECT_EQ(j["bytes_per_param"]["step"].get<double>(), 38.0);
}

// f32 parameters: offload_serial's are its master weights, so its update moves 28
// bytes a parameter (no copy written) against 32 for a separate parameter, and every
// schedule still ends with the same bits.
TEST(OptimizerBench, F32ParametersAreTheMasterInTheSerialUpdate) {
  auto o = small();
  o.param_dtype = DType::f32;
  o.grad_dtype = DType::f32;
  nlohmann::json j = run_optimizer_bench(o);
  EXPECT_TRUE(j["bitwise_equal"].get<bool>());
  EXPECT_EQ(j["bytes_per_param"]["update"].get<double>(), 28.0);
  EXPECT_EQ(j["bytes_per_param"]["stream_update"].get<double>(), 32.0);
}

TEST(OptimizerBench, BadOptionsAreInvalidArgument) {
  auto o = small();
  o.schedules = {"device", "nvme"};
  EXPECT_THROW(run_optimizer_bench(o), InvalidArgument);
  o = small();
  o.params = 0;
  EXPECT_THROW(run_optimizer_bench(o), InvalidArgument);
  o = small();
  o.grad_dtype = DType::f32;
  o.bucket_bytes = 2;
  EXPECT_THROW(run_optimizer_bench(o), InvalidArgument);
}

using peakbound::testing::CliRun;
using peakbound::testing::run_cli;

TEST(OptimizerBench, CliPrintsOneJsonObjectOrOneLineError) {
  CliRun ok = run_cli("bench optimizer --params 5000 --bucket-bytes 1KiB --warmup 1 --steps 1 --bandwidth-bytes 1MiB --json");
  ASSERT_EQ(ok.code, 0) << ok.err;
  auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["config"]["params"].get<int>(), 5000);
  EXPECT_TRUE(j["bitwise_equal"].get<bool>());
  CliRun bad = run_cli("bench optimizer --params 5000 --schedules device,zero");
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(bad.err.rfind("peakbound: error: ", 0), 0u) << bad.err;
  EXPECT_NE(bad.err.find("zero"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}


// Issue 17: --threads 5000 under a virtual-memory limit used to hang the ThreadPool's
// constructor. The CLI bounds --threads, and a pool the system cannot start (1024
// threads' 8 MiB stacks do not fit in 4 GB of address space) fails with one line,
// quickly, instead of hanging.
TEST(OptimizerBench, ThreadsOutOfRangeAndUnstartableThreadsAreOneLineErrors) {
  using peakbound::testing::expect_one_line_error;
  expect_one_line_error(run_cli("bench optimizer --params 5000 --threads 5000"), "--threads");
  expect_one_line_error(run_cli("bench optimizer --params 5000 --threads 0"), "--threads");
  if (!peakbound::testing::address_space_limits_apply()) GTEST_SKIP() << "sanitizer build: ulimit -v cannot apply";
  // 8 MiB stacks (the usual default) so that 1024 threads cannot fit in 4 GB.
  const CliRun r = run_cli("", 120,
                           "sh -c 'ulimit -s 8192; ulimit -v 4000000; exec " + std::string(PEAKBOUND_CLI_PATH) +
                               " bench optimizer --params 5000 --threads 1024 --warmup 0 --steps 1 --bandwidth-bytes 1MiB'");
  EXPECT_NE(r.code, 124) << "timed out: the pool's constructor hung";
  expect_one_line_error(r, "thread");
}

TEST(OptimizerBench, LibraryErrorsNameTheOptionNotTheFlag) {
  auto o = small();
  o.threads = 5000;
  try {
    run_optimizer_bench(o);
    FAIL() << "5000 threads were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("threads must be between 1 and 1024"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
