// Under mpirun a user error is one line, printed once, and no rank calls MPI_Abort
// when every rank agrees the input is bad; one-process commands report once (so
// `plan --json` is one valid JSON document). Issue 17.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::run_mpi;

int occurrences(const std::string& s, const std::string& needle) {
  int n = 0;
  for (std::size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

void expect_once_without_abort(const CliRun& r, const std::string& needle) {
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_EQ(occurrences(r.err, "peakbound: error: "), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
}

TEST(MpiOutput, AgreedUserErrorsArePrintedOnceWithoutAbort) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  expect_once_without_abort(run_mpi("bench dispatch --experts 7 --tokens 16", 2), "not divisible by the 2 ranks");
  expect_once_without_abort(run_mpi("verify dispatch --topk 61 --experts 60", 2), "--topk 61");
  expect_once_without_abort(run_mpi("bench vocab --tokens 64 --device-memory 4KiB", 2), "--device-memory");
  expect_once_without_abort(run_mpi("verify vocab --z-loss nan", 2), "--z-loss");
  expect_once_without_abort(run_mpi("plan --devices 0", 2), "--devices");
}

// mpirun ends the job when the first rank exits non-zero. Under load a non-lead rank
// used to get there before rank 0 had written its line, and the user saw mpirun's box
// and no reason. Rank 0 is made the last here (a testing hook delays its line by 1.5 s):
// the other ranks must wait for it. A bad flag, a failed check before communication, and
// a refusal every rank reaches in the run (the plan over --device-memory).
TEST(MpiOutput, AgreedErrorsReachTheUserWhenRankZeroIsTheLastToPrint) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string late = "PEAKBOUND_TEST_DELAY_LEAD_ERROR_MS=1500";
  expect_once_without_abort(run_mpi("train --steps 0", 2, 120, late), "--steps");
  expect_once_without_abort(run_mpi("train --seq-len 30 --cp 4", 2, 120, late), "--cp");
  expect_once_without_abort(run_mpi("train --steps 1 --seq-len 32 --device-memory 1MiB", 2, 120, late),
                            "over the 1.00 MiB budget");
  expect_once_without_abort(run_mpi("verify vocab --z-loss nan", 3, 120, late), "--z-loss");
}

// The device's arena refusing the model's parameters (--no-plan-check lets the run start)
// fails on every rank in setup: agreed there, so one line and no MPI_Abort.
TEST(MpiOutput, ASetupRefusalOnEveryRankIsOneLine) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  // --no-plan-check: the device's arena refuses the first allocation past the budget on
  // every rank, each a rank-local failure agreed at setup: one line.
  CliRun r = run_mpi("train --steps 1 --seq-len 32 --device-memory 1MiB --no-plan-check", 2);
  expect_once_without_abort(r, "params");
}

// Weights every rank reads alike and finds broken (a truncated safetensors file): one
// line under mpirun, from train and from eval, not one per rank with MPI_Abort's banner.
TEST(MpiOutput, ABrokenWeightFileIsOneLine) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "pb_mpi_output_broken_hf";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path src = fs::path(PEAKBOUND_SOURCE_DIR) / "tests/fixtures/hf/qwen3_moe";
  fs::copy_file(src / "config.json", dir / "config.json");
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  expect_once_without_abort(run_mpi("train --steps 1 --seq-len 32 --model " + dir.string(), 2), "model.safetensors");
  fs::remove_all(dir);
}

TEST(MpiOutput, OneProcessCommandsReportOnce) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  CliRun r = run_mpi("plan --model tiny-moe --json", 2);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;  // two objects would not parse
  r = run_mpi("bench checkpoint --layers 2 --tokens 32 --hidden 16 --json", 2);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << r.out;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
