// Stopping `train` (issue 25): a signal during a step of many micro-batches stops at the
// next micro-batch boundary instead of the end of the step; a second SIGINT / SIGTERM
// ends the process at once, even while the first is being handled; SIGUSR1 (what mpirun
// forwards) only ever asks for the graceful stop. And a plan larger than the machine's
// memory is refused before step 1, within seconds, instead of the OOM killer ending the
// run minutes in.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <fstream>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/system_memory.h"
#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::run_cli;

std::string log_path(const std::string& name) {
  return ::testing::TempDir() + "/pb_stop_" + name + "_" + std::to_string(::getpid()) + ".log";
}

// Under a generous `timeout`, so a run that ignores the signals ends anyway (exit 124)
// and fails the test.
pid_t spawn(const std::string& args, const std::string& log) { return testing::spawn_cli(args, log, 240); }
using testing::wait_exit;

// Waits until the run has printed its start-up (the signal handlers are installed by
// then and step 1 is under way); false if it exited or took minutes.
bool wait_started(pid_t pid, const std::string& log) {
  for (int i = 0; i < 1800; ++i) {
    if (testing::slurp(log).find("cannot beat") != std::string::npos) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The process `timeout` runs (the child of the shell we forked, which `exec`ed timeout).
// Signals go to the peakbound process itself, as a user's `kill` would.
pid_t peakbound_pid(pid_t timeout_pid) {
  for (int i = 0; i < 100; ++i) {
    FILE* p = popen(("pgrep -P " + std::to_string(timeout_pid)).c_str(), "r");
    long child = 0;
    if (p) {
      if (std::fscanf(p, "%ld", &child) != 1) child = 0;
      pclose(p);
    }
    if (child > 0) return static_cast<pid_t>(child);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

// A step of 100000 micro-batches (minutes, even at 16 tokens each).
const std::string kLongStep = "train --seq-len 16 --accumulation 100000 --steps 2 --eval-every 0 --eval-batches 0";

TEST(TrainStop, SigintStopsBetweenMicroBatchesNotAtTheEndOfTheStep) {
  const std::string log = log_path("int");
  const pid_t pid = spawn(kLongStep, log);
  ASSERT_TRUE(wait_started(pid, log)) << testing::slurp(log);
  const pid_t pb = peakbound_pid(pid);
  ASSERT_GT(pb, 0);
  kill(pb, SIGINT);
  const int code = wait_exit(pid);
  const std::string out = testing::slurp(log);
  EXPECT_NE(code, 124) << "the run ignored SIGINT until the timeout: " << out;
  EXPECT_EQ(code, 130) << out;  // no --save-dir
  EXPECT_NE(out.find("stopped by signal 2 during step 1 (its micro-batches discarded"), std::string::npos) << out;
  EXPECT_NE(out.find("no --save-dir, nothing saved"), std::string::npos) << out;
  EXPECT_EQ(out.find("second signal"), std::string::npos) << out;
  std::remove(log.c_str());
}

TEST(TrainStop, ASecondSignalExitsAtOnceEvenWhileTheFirstIsHandled) {
  // Long micro-batches: the first SIGTERM is still waiting for a micro-batch boundary
  // (being handled) when the second arrives.
  const std::string log = log_path("twice");
  const pid_t pid = spawn("train --seq-len 1024 --batch 4 --accumulation 100000 --steps 2 --eval-batches 0", log);
  ASSERT_TRUE(wait_started(pid, log)) << testing::slurp(log);
  const pid_t pb = peakbound_pid(pid);
  ASSERT_GT(pb, 0);
  kill(pb, SIGTERM);
  kill(pb, SIGINT);
  const int code = wait_exit(pid);
  const std::string out = testing::slurp(log);
  EXPECT_NE(code, 124) << "the run ignored two signals until the timeout: " << out;
  // The kernel delivers the two pending signals in either order: 128 + the second's.
  EXPECT_TRUE(code == 128 + SIGINT || code == 128 + SIGTERM) << code << ": " << out;
  EXPECT_NE(out.find("peakbound: second signal, exiting at once; the last complete checkpoint stays"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("stopped by signal"), std::string::npos) << out;
  std::remove(log.c_str());
}

TEST(TrainStop, RepeatedSigusr1StaysAGracefulStopAndSavesNothingUnfinished) {
  const std::string log = log_path("usr1"), dir = log_path("usr1_dir");
  std::filesystem::remove_all(dir);
  const pid_t pid = spawn(kLongStep + " --save-dir " + dir, log);
  ASSERT_TRUE(wait_started(pid, log)) << testing::slurp(log);
  const pid_t pb = peakbound_pid(pid);
  ASSERT_GT(pb, 0);
  kill(pb, SIGUSR1);
  kill(pb, SIGUSR1);
  const int code = wait_exit(pid);
  const std::string out = testing::slurp(log);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("stopped by signal 10 during step 1 (its micro-batches discarded"), std::string::npos) << out;
  EXPECT_NE(out.find("no step completed, nothing saved"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "latest")) << "an abandoned step was saved";
  std::filesystem::remove_all(dir);
  std::remove(log.c_str());
}

// Under mpirun: SIGUSR1 to mpirun (which forwards it to every rank) stops the ranks
// together between micro-batches, no rank left waiting in a collective.
TEST(TrainStop, RanksUnderMpirunStopTogetherBetweenMicroBatches) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const std::string log = log_path("mpi");
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string cmd = "exec timeout -k 5 240 env OMPI_MCA_btl_vader_single_copy_mechanism=none "
                            "OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe -np 2 " +
                            std::string(PEAKBOUND_CLI_PATH) + " " + kLongStep + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(wait_started(pid, log)) << testing::slurp(log);
  const pid_t mpirun = peakbound_pid(pid);  // timeout's child: env exec'd mpirun
  ASSERT_GT(mpirun, 0);
  kill(mpirun, SIGUSR1);
  const int code = wait_exit(pid);
  const std::string out = testing::slurp(log);
  EXPECT_NE(code, 124) << "the ranks ignored SIGUSR1 until the timeout: " << out;
  EXPECT_EQ(code, 130) << out;  // no --save-dir
  EXPECT_NE(out.find("stopped by signal 10 during step 1 (its micro-batches discarded"), std::string::npos) << out;
  std::remove(log.c_str());
}

std::vector<std::string> losses(const std::string& metrics) {
  std::vector<std::string> out;
  std::ifstream m(metrics);
  for (std::string line; std::getline(m, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line)["loss"].dump());
  return out;
}

// A stop during a step saves the last complete step with its data position: the resumed
// run's losses continue the interrupted run's exactly as an uninterrupted run's do. (The
// signal is sent just after a step's metrics line appears, so it lands in the next step's
// micro-batches; should it land in the last one, the run stops after that step instead,
// which must resume as exactly.)
TEST(TrainStop, AStopDuringAStepSavesTheLastCompleteStepAndTheResumeIsExact) {
  const std::string dir = log_path("resume_dir"), log = log_path("resume"), a = dir + "_a.jsonl",
                    b = dir + "_b.jsonl", c = dir + "_c.jsonl";
  std::filesystem::remove_all(dir);
  const std::string run = "train --seq-len 16 --accumulation 8 --steps 4 --eval-every 0 --eval-batches 0";
  const pid_t pid = spawn(run + " --save-dir " + dir + " --metrics " + a, log);
  for (int i = 0; i < 3000 && losses(a).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t pb = peakbound_pid(pid);
  ASSERT_GT(pb, 0);
  kill(pb, SIGINT);
  ASSERT_EQ(wait_exit(pid), 0) << testing::slurp(log);
  const std::string out = testing::slurp(log);
  ASSERT_NE(out.find("stopped by signal 2"), std::string::npos) << out;
  const std::vector<std::string> first = losses(a);
  ASSERT_FALSE(first.empty());
  ASSERT_LT(first.size(), 4u) << "the run finished before the signal";
  if (out.find("during step") != std::string::npos) {
    EXPECT_NE(out.find("resume with --resume " + dir), std::string::npos) << out;
    EXPECT_NE(out.find("during step " + std::to_string(first.size() + 1) + " "), std::string::npos) << out;
  }
  std::printf("stopped %s\n", out.find("during step") != std::string::npos ? "during a step" : "after a step");
  CliRun rest = run_cli(run + " --resume " + dir + " --metrics " + b, 300);
  ASSERT_EQ(rest.code, 0) << rest.err;
  CliRun straight = run_cli(run + " --metrics " + c, 300);
  ASSERT_EQ(straight.code, 0) << straight.err;
  std::vector<std::string> joined = first;
  for (const std::string& l : losses(b)) joined.push_back(l);
  EXPECT_EQ(joined, losses(c)) << "stopped after " << first.size() << " steps: " << out;
  for (const std::string& p : {a, b, c, log}) std::remove(p.c_str());
  std::filesystem::remove_all(dir);
}

// The built-in model at --batch 100000 planned about 26 GiB on a 23 GiB machine and the
// OOM killer ended it after 277 s: the refusal comes first, before anything large is
// allocated. The batch grows with the machine so the plan exceeds it anywhere.
TEST(TrainMachineMemory, APlanLargerThanTheMachineIsRefusedBeforeStepOne) {
  const MachineMemory m = machine_memory();
  if (m.bytes == 0) GTEST_SKIP() << "no /proc/meminfo here";
  const std::uint64_t per_20gib = (m.bytes + (20ull << 30) - 1) / (20ull << 30);
  const std::uint64_t batch = std::min<std::uint64_t>(100000 * per_20gib, 1 << 20);
  const std::uint64_t seq_len = 128 * std::max<std::uint64_t>(1, 100000 * per_20gib / (1 << 20) + 1);
  CliRun r = run_cli("train --batch " + std::to_string(batch) + " --seq-len " + std::to_string(seq_len), 60);
  testing::expect_one_line_error(r, "of this machine's memory");
  EXPECT_NE(r.err.find("shorten --seq-len or --batch"), std::string::npos) << r.err;
}

TEST(TrainMachineMemory, ADeviceBudgetOverTheMachineIsRefusedOnTheCpuDevice) {
  const MachineMemory m = machine_memory();
  if (m.bytes == 0) GTEST_SKIP() << "no /proc/meminfo here";
  const std::string budget = std::to_string(m.bytes + (1ull << 30));
  CliRun r = run_cli("train --steps 1 --seq-len 16 --eval-batches 0 --device-memory " + budget, 60);
  testing::expect_one_line_error(r, "lower --device-memory");
  EXPECT_NE(r.err.find("the cpu device's arena is host memory"), std::string::npos) << r.err;
}

// Ranks under mpirun share the machine: two ranks of 60% of it each do not fit, though
// one alone does.
TEST(TrainMachineMemory, TheRanksOnOneMachineShareItsMemory) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const MachineMemory m = machine_memory();
  if (m.bytes == 0) GTEST_SKIP() << "no /proc/meminfo here";
  const std::string args =
      "train --steps 1 --seq-len 16 --eval-batches 0 --device-memory " + std::to_string(m.bytes / 10 * 6);
  CliRun two = testing::run_mpi(args, 2, 120);
  // Printed once (rank 0), no MPI_Abort; mpirun adds its own box.
  EXPECT_NE(two.code, 0);
  EXPECT_NE(two.code, 124) << "timed out";
  const std::size_t first = two.err.find("peakbound: error: ");
  ASSERT_NE(first, std::string::npos) << two.err;
  EXPECT_EQ(two.err.find("peakbound: error: ", first + 1), std::string::npos) << two.err;
  EXPECT_NE(two.err.find("x 2 ranks on this machine"), std::string::npos) << two.err;
  EXPECT_EQ(two.err.find("MPI_ABORT"), std::string::npos) << two.err;
  CliRun one = run_cli(args, 120);
  EXPECT_EQ(one.code, 0) << one.err;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
