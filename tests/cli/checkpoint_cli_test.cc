// `train --save-dir / --resume` as a user meets them: a run killed with SIGKILL at random
// moments (most of them inside a checkpoint write) still resumes from its last complete
// checkpoint; SIGTERM finishes the step, saves and exits 0, and the resumed run continues
// bit for bit; a save folder that cannot be written, a missing checkpoint and a model
// whose weights hold a NaN are one-line errors; a rank killed under mpirun ends the job.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/io/safetensors.h"
#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;

const std::string kArgs = "train --seq-len 16 --eval-every 0 --warmup 2";

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/pb_ckcli_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::vector<std::string> losses(const std::string& metrics) {
  std::vector<std::string> out;
  std::ifstream m(metrics);
  for (std::string line; std::getline(m, line);) out.push_back(nlohmann::json::parse(line)["loss"].dump());
  return out;
}

pid_t spawn(const std::string& args, const std::string& log) { return testing::spawn_cli(args, log); }
using testing::wait_exit;

TEST(RunCheckpointCli, SigkillAtRandomMomentsLeavesALoadableCheckpoint) {
  const std::string dir = fresh_dir("kill");
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_ms(1500, 5000);
  int mid_write = 0, trials = 4;
  for (int t = 0; t < trials; ++t) {
    // Saves every step: most of the run's time is spent writing, so most kills land in a write.
    // The folder is the run's: after the first checkpoint each trial continues it.
    const std::string resume = fs::exists(fs::path(dir) / "latest") ? " --resume " + dir : "";
    const pid_t pid = spawn(kArgs + " --steps 100000 --save-every 1 --keep 2 --save-dir " + dir + resume, dir + ".log");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    kill(pid, SIGKILL);
    EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
    // On a loaded machine the kill may land before the run created its save folder.
    if (!fs::exists(dir)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp") != std::string::npos) ++mid_write;
    if (!fs::exists(fs::path(dir) / "latest")) continue;  // killed before the first save finished
    std::ifstream l(fs::path(dir) / "latest");
    std::string name;
    std::getline(l, name);
    const long step = std::stol(name.substr(5));
    // The checkpoint `latest` names loads (sizes, checksums, every tensor) and trains on.
    CliRun r = run_cli(kArgs + " --steps " + std::to_string(step + 1) + " --resume " + dir, 300);
    EXPECT_EQ(r.code, 0) << "after a kill at trial " << t << ": " << r.err;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  }
  std::printf("SIGKILL x %d: %d landed inside a checkpoint write; every `latest` loaded\n", trials, mid_write);
  fs::remove_all(dir);
  std::remove((dir + ".log").c_str());
}

TEST(RunCheckpointCli, SigtermSavesExitsZeroAndTheResumeIsBitwise) {
  const std::string dir = fresh_dir("term"), a = dir + "_a.jsonl", b = dir + "_b.jsonl", c = dir + "_c.jsonl";
  const std::string run = kArgs + " --steps 120 --save-dir " + dir;
  const pid_t pid = spawn(run + " --metrics " + a, dir + ".log");
  // Past the start-up (plan, model), then stop it.
  for (int i = 0; i < 600 && losses(a).size() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 0) << testing::slurp(dir + ".log");
  const std::string log = testing::slurp(dir + ".log");
  EXPECT_NE(log.find("stopped by signal 15 after step"), std::string::npos) << log;
  const std::vector<std::string> first = losses(a);
  ASSERT_FALSE(first.empty());
  ASSERT_LT(first.size(), 120u) << "the run finished before the signal";
  CliRun rest = run_cli(run + " --resume " + dir + " --metrics " + b, 600);
  ASSERT_EQ(rest.code, 0) << rest.err;
  CliRun straight = run_cli(kArgs + " --steps 120 --metrics " + c, 600);
  ASSERT_EQ(straight.code, 0) << straight.err;
  std::vector<std::string> joined = first;
  for (const std::string& l : losses(b)) joined.push_back(l);
  EXPECT_EQ(joined, losses(c)) << "stopped after " << first.size() << " steps";
  for (const std::string& p : {a, b, c, dir + ".log"}) std::remove(p.c_str());
  fs::remove_all(dir);
}

TEST(RunCheckpointCli, BadSaveAndResumeFoldersAreOneLineErrors) {
  // A folder that cannot be created (a path under a regular file): the first save fails.
  const std::string file = fresh_dir("file");
  std::ofstream(file) << "x";
  CliRun r = run_cli(kArgs + " --steps 2 --save-dir " + file + "/ck", 300);
  testing::expect_one_line_error(r, file);
  std::remove(file.c_str());
  testing::expect_one_line_error(run_cli(kArgs + " --steps 2 --resume /nonexistent/peakbound", 60),
                                 "does not exist");
  const std::string empty = fresh_dir("empty");
  fs::create_directories(empty);
  testing::expect_one_line_error(run_cli(kArgs + " --steps 2 --resume " + empty, 60), "holds no checkpoint");
  fs::remove_all(empty);
  testing::expect_one_line_error(run_cli(kArgs + " --steps 2 --save-every 1", 60), "--save-every needs --save-dir");
  testing::expect_one_line_error(run_cli(kArgs + " --steps 2 --on-nonfinite maybe", 60), "--on-nonfinite");
}

// A checkpoint of 2 ranks resumes on 1 rank and on 4 ranks with --cp 2 (the same global
// batch: --batch 2 on one rank, 1 per cp group on four): the pieces are placed by overlap,
// the data position is global, so the continuation is the same run to fp32 rounding (in f32:
// bf16 rounds differently on each layout).
TEST(RunCheckpointCli, ACheckpointResumesOnOtherWorldSizes) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const std::string dir = fresh_dir("worlds"), a = dir + "_a.jsonl", b = dir + "_b.jsonl", c = dir + "_c.jsonl";
  const std::string args = "train --precision f32 --seq-len 32 --eval-every 0 --steps 6";
  ASSERT_EQ(testing::run_mpi(args + " --metrics " + a + " --save-dir " + dir + " --save-every 3", 2, 300).code, 0);
  // `latest` is step 6; resume from step 3 on other layouts.
  const std::string step3 = dir + "/step-00000003";
  CliRun one = run_cli(args + " --batch 2 --resume " + step3 + " --metrics " + b, 300);
  ASSERT_EQ(one.code, 0) << one.err;
  CliRun four = testing::run_mpi(args + " --cp 2 --resume " + step3 + " --metrics " + c, 4, 300);
  ASSERT_EQ(four.code, 0) << four.err;
  const std::vector<std::string> ref = losses(a), x = losses(b), y = losses(c);
  ASSERT_EQ(ref.size(), 6u);
  ASSERT_EQ(x.size(), 3u);
  ASSERT_EQ(y.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const double want = std::stod(ref[3 + i]);
    EXPECT_NEAR(std::stod(x[i]), want, 1e-5 * want) << "1 rank, step " << 4 + i;
    EXPECT_NEAR(std::stod(y[i]), want, 1e-5 * want) << "4 ranks cp 2, step " << 4 + i;
  }
  for (const std::string& p : {a, b, c}) std::remove(p.c_str());
  fs::remove_all(dir);
}

// A model whose weights hold a NaN (the fixture with one element poisoned): step 1 stops
// with the step and the first non-finite gradient named, exit 1; with
// --on-nonfinite skip the run finishes, every step skipped and counted.
// A copy of the qwen3_moe fixture whose model.norm.weight starts with `value`.
std::string fixture_with_norm_weight(const std::string& name, float value) {
  const std::string src = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";
  const std::string dst = fresh_dir(name);
  fs::create_directories(dst);
  for (const fs::directory_entry& e : fs::directory_iterator(src)) fs::copy(e.path(), fs::path(dst) / e.path().filename());
  const std::string st = dst + "/model.safetensors";
  std::vector<std::vector<std::byte>> data;
  std::vector<SafeTensorOut> out;
  {
    const SafeTensorsFile f = SafeTensorsFile::open(st);
    for (const SafeTensorInfo& t : f.tensors()) {
      const auto b = f.bytes(t.name);
      data.emplace_back(b.begin(), b.end());
    }
    std::size_t i = 0;
    for (const SafeTensorInfo& t : f.tensors()) {
      std::vector<std::byte>& d = data[i++];
      if (t.name == "model.norm.weight" && t.dtype == "F32") std::memcpy(d.data(), &value, sizeof value);
      out.push_back({t.name, t.dtype, t.shape, d.data(), d.size()});
    }
  }
  write_safetensors(st, out);
  return dst;
}

// A NaN in the weights is refused at load, naming the tensor (step 1 used to blame
// model.embed_tokens.weight and advise a lower --lr).
TEST(RunCheckpointCli, ANanInTheWeightsIsRefusedAtLoadNamingTheTensor) {
  const std::string dst = fixture_with_norm_weight("nan", std::numeric_limits<float>::quiet_NaN());
  CliRun r = run_cli("train --model " + dst + " --seq-len 16 --steps 3 --eval-every 0", 300);
  testing::expect_one_line_error(r, "model.norm.weight");
  EXPECT_NE(r.err.find("NaN"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step 1"), std::string::npos) << r.err;
  fs::remove_all(dst);
}

// Finite weights whose forward overflows (a final-norm weight of 3e38) make a non-finite
// loss at step 1: the run stops naming the step and the first non-finite gradient, or
// with --on-nonfinite skip skips that step (and each later one whose loss or gradient is
// not finite: which are depends on the batch, since the head scores only the tokens
// with a target and the overflow need not reach them) and ends normally.
TEST(RunCheckpointCli, ANonFiniteLossStopsTheRunNamingTheTensor) {
  const std::string dst = fixture_with_norm_weight("overflow", 3e38f);
  const std::string args = "train --model " + dst + " --seq-len 16 --steps 3 --eval-every 0";
  CliRun r = run_cli(args, 300);
  testing::expect_one_line_error(r, "step 1: the loss is ");
  EXPECT_NE(r.err.find("first non-finite gradient: "), std::string::npos) << r.err;
  CliRun skip = run_cli(args + " --on-nonfinite skip --json", 300);
  EXPECT_EQ(skip.code, 0) << skip.err;
  EXPECT_NE(skip.out.find("skipped: step 1: the loss is "), std::string::npos) << skip.out;
  EXPECT_NE(skip.out.find(" skipped: non-finite)"), std::string::npos) << skip.out;
  fs::remove_all(dst);
}

// A rank that dies under mpirun: the others do not hang in a collective; the job ends
// within seconds with a message.
TEST(RunCheckpointCli, ARankKilledUnderMpirunEndsTheJob) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const std::string log = fresh_dir("rankdeath");
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string cmd = "exec env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1 "
                            "mpirun --allow-run-as-root --oversubscribe -np 2 " +
                            std::string(PEAKBOUND_CLI_PATH) + " " + kArgs + " --steps 100000 >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once it trains, kill one rank (the newest peakbound process).
  for (int i = 0; i < 600 && testing::slurp(log).find("step ") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // The newest child of mpirun: one of the ranks it started.
  ASSERT_EQ(std::system(("pkill -9 -n -P " + std::to_string(pid)).c_str()), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = wait_exit(pid);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(code, 0);
  EXPECT_LT(seconds, 60.0) << "the surviving rank hung";  // a hang check, not a timing one
  EXPECT_NE(testing::slurp(log).find("signal 9"), std::string::npos) << testing::slurp(log);
  std::printf("a rank killed under mpirun: the job ended %.1f s later (exit %d)\n", seconds, code);
  std::remove(log.c_str());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
