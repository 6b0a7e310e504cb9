// `train --save-dir / --resume / --metrics` against careless use (issue 25): two runs
// sharing a save folder, another run's folder, a user's look-alike step folder, a save
// folder that cannot be created, a resume that changes the run's meaning, the metrics
// history on resume, a `--resume` that names a file or a folder whose `latest` is binary,
// and a damaged file of rank 1 under mpirun (one line, printed once, no abort).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using testing::CliRun;
using testing::expect_one_line_error;
using testing::run_cli;

const std::string kArgs = "train --seq-len 16 --eval-every 0 --warmup 2";

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/pb_savedir_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::string latest(const std::string& dir) {
  std::ifstream l(fs::path(dir) / "latest");
  std::string name;
  std::getline(l, name);
  return name;
}

int occurrences(const std::string& s, const std::string& needle) {
  int n = 0;
  for (std::size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

// A second run on a folder a live run holds: refused at once, naming the folder and the
// holder's pid; the live run's checkpoints are untouched.
TEST(SaveDirCli, TwoRunsCannotShareASaveFolder) {
  const std::string dir = fresh_dir("shared"), log = dir + ".log";
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string cmd = "exec " + std::string(PEAKBOUND_CLI_PATH) + " " + kArgs +
                            " --steps 100000 --save-every 100000 --save-dir " + dir + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 600 && testing::slurp(log).find("step ") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(testing::slurp(log).find("step "), std::string::npos) << testing::slurp(log);
  CliRun second = run_cli(kArgs + " --steps 2 --save-dir " + dir, 120);
  expect_one_line_error(second, dir);
  EXPECT_NE(second.err.find("pid " + std::to_string(pid)), std::string::npos) << second.err;
  EXPECT_EQ(second.out.find("step 1/"), std::string::npos) << "trained before refusing: " << second.out;
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  // The lock dies with its holder: the folder is usable again.
  CliRun after = run_cli(kArgs + " --steps 2 --save-dir " + dir, 120);
  EXPECT_EQ(after.code, 0) << after.err;
  fs::remove_all(dir);
  std::remove(log.c_str());
}

// A folder holding another run's checkpoints (another model, another seed) or a user's
// files is refused before step 1, and nothing in it changes; a resume of that run into
// the same folder is the same run and is accepted.
TEST(SaveDirCli, AnotherRunsFolderOrAUsersFolderIsRefused) {
  const std::string dir = fresh_dir("other");
  ASSERT_EQ(run_cli(kArgs + " --steps 2 --keep 1 --save-dir " + dir, 120).code, 0);
  ASSERT_EQ(latest(dir), "step-00000002");
  const std::string hf = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";
  CliRun other = run_cli("train --model " + hf + " --seq-len 16 --eval-every 0 --steps 1 --keep 1 --save-dir " + dir, 120);
  expect_one_line_error(other, dir);
  EXPECT_NE(other.err.find("another run"), std::string::npos) << other.err;
  EXPECT_EQ(other.out.find("step 1/"), std::string::npos) << other.out;
  expect_one_line_error(run_cli(kArgs + " --steps 1 --seed 7 --save-dir " + dir, 120), "another run");
  EXPECT_EQ(latest(dir), "step-00000002");
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000002" / "manifest.json"));
  // The same run resumed into its own folder.
  CliRun resumed = run_cli(kArgs + " --steps 3 --keep 1 --resume " + dir + " --save-dir " + dir, 120);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(latest(dir), "step-00000003");

  // A user's folder (their own files, one of them named like a step folder).
  const std::string mine = fresh_dir("mine");
  fs::create_directories(fs::path(mine) / "step-00000002");
  std::ofstream(fs::path(mine) / "step-00000002" / "notes.txt") << "mine";
  std::ofstream(fs::path(mine) / "results.csv") << "a,b";
  CliRun user = run_cli(kArgs + " --steps 2 --keep 1 --save-dir " + mine, 120);
  expect_one_line_error(user, mine);
  EXPECT_TRUE(fs::exists(fs::path(mine) / "step-00000002" / "notes.txt"));
  EXPECT_TRUE(fs::exists(fs::path(mine) / "results.csv"));
  fs::remove_all(dir);
  fs::remove_all(mine);
}

// A run killed during its first save leaves run.json and no checkpoint: nothing to guard,
// so the next run takes the folder.
TEST(SaveDirCli, AFolderWithoutCheckpointsIsTakenOver) {
  const std::string dir = fresh_dir("stale");
  fs::create_directories(dir);
  std::ofstream(fs::path(dir) / "run.json") << R"({"format": "peakbound-run", "run_id": "dead", "identity": {}})";
  std::ofstream(fs::path(dir) / ".lock") << "pid 1 on nowhere\n";
  fs::create_directories(fs::path(dir) / ".step-00000001.tmp");
  CliRun r = run_cli(kArgs + " --steps 1 --save-dir " + dir, 120);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(latest(dir), "step-00000001");
  EXPECT_EQ(testing::slurp(dir + "/run.json").find("dead"), std::string::npos);
  fs::remove_all(dir);
}

// --keep prunes only this run's checkpoints: a look-alike step folder a user put into the
// run's folder stays, and one in the way of a save is not overwritten.
TEST(SaveDirCli, KeepPrunesOnlyThisRunsCheckpoints) {
  const std::string dir = fresh_dir("keep");
  ASSERT_EQ(run_cli(kArgs + " --steps 1 --keep 1 --save-dir " + dir, 120).code, 0);
  fs::create_directories(fs::path(dir) / "step-00000000");
  std::ofstream(fs::path(dir) / "step-00000000" / "notes.txt") << "mine";
  CliRun r = run_cli(kArgs + " --steps 3 --save-every 1 --keep 1 --resume " + dir + " --save-dir " + dir, 120);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(latest(dir), "step-00000003");
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000000" / "notes.txt"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step-00000001"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step-00000002"));
  // A look-alike where the next save goes: the save is refused, the folder kept.
  fs::create_directories(fs::path(dir) / "step-00000004");
  std::ofstream(fs::path(dir) / "step-00000004" / "notes.txt") << "mine";
  CliRun in_the_way = run_cli(kArgs + " --steps 4 --keep 1 --resume " + dir + " --save-dir " + dir, 120);
  expect_one_line_error(in_the_way, "step-00000004");
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000004" / "notes.txt"));
  EXPECT_EQ(latest(dir), "step-00000003");
  fs::remove_all(dir);
}

// A save folder that cannot be a folder is refused before step 1, not at the first save.
TEST(SaveDirCli, AnUnusableSaveFolderIsRefusedBeforeStepOne) {
  const std::string file = fresh_dir("file");
  std::ofstream(file) << "x";
  for (const std::string& bad : {file, file + "/ck", std::string("/dev/null"), std::string("/proc/peakbound-ck")}) {
    SCOPED_TRACE(bad);
    CliRun r = run_cli(kArgs + " --steps 3 --save-dir " + bad, 120);
    expect_one_line_error(r, bad);
    EXPECT_NE(r.err.find("--save-dir"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << "trained before refusing: " << r.out;
  }
  std::remove(file.c_str());
}

std::vector<nlohmann::json> rows(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream m(path);
  for (std::string line; std::getline(m, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// --metrics on resume continues the history (a partial last line of a killed run is
// dropped, so every line stays one JSON object); a fresh run starts the file anew.
TEST(SaveDirCli, ResumeAppendsToTheMetricsFile) {
  const std::string dir = fresh_dir("metrics"), m = dir + ".jsonl";
  ASSERT_EQ(run_cli(kArgs + " --steps 2 --save-dir " + dir + " --metrics " + m, 120).code, 0);
  ASSERT_EQ(rows(m).size(), 2u);
  std::ofstream(m, std::ios::app) << "{\"step\": 3, \"loss";  // a run killed mid-line
  CliRun r = run_cli(kArgs + " --steps 4 --resume " + dir + " --metrics " + m, 120);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<nlohmann::json> got;
  ASSERT_NO_THROW(got = rows(m)) << testing::slurp(m);
  ASSERT_EQ(got.size(), 4u) << testing::slurp(m);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i]["step"], i + 1);
  ASSERT_EQ(run_cli(kArgs + " --steps 1 --metrics " + m, 120).code, 0);
  EXPECT_EQ(rows(m).size(), 1u);
  fs::remove_all(dir);
  std::remove(m.c_str());
}

void write_tokens(const std::string& path, int salt) {
  std::ofstream f(path, std::ios::binary);
  const int n = 4000;
  int header[256] = {20240520, 1, n};
  f.write(reinterpret_cast<const char*>(header), sizeof(header));
  for (int i = 0; i < n; ++i) {
    const unsigned short t = static_cast<unsigned short>((i * 7919 + salt) % 16384);
    f.write(reinterpret_cast<const char*>(&t), 2);
  }
}

// What changes the run's meaning is refused on resume, naming the flag, the checkpoint's
// value and the given one; what may change is accepted and said.
TEST(SaveDirCli, ResumeRefusesWhatChangesTheRun) {
  const std::string dir = fresh_dir("meaning");
  ASSERT_EQ(run_cli(kArgs + " --steps 2 --save-dir " + dir, 120).code, 0);
  const std::string resume = " --steps 3 --resume " + dir;
  CliRun seed = run_cli(kArgs + resume + " --seed 9", 120);
  expect_one_line_error(seed, "--seed");
  EXPECT_NE(seed.err.find("9"), std::string::npos) << seed.err;
  expect_one_line_error(run_cli("train --seq-len 32 --eval-every 0 --warmup 2" + resume, 120), "--seq-len");
  expect_one_line_error(run_cli(kArgs + resume + " --task kv", 120), "--task");
  expect_one_line_error(run_cli(kArgs + resume + " --symbols 32", 120), "--symbols");
  const std::string tokens = dir + "_tokens.bin";
  write_tokens(tokens, 0);
  expect_one_line_error(run_cli(kArgs + resume + " --data " + tokens, 120), "--data");
  const std::string hf = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";
  expect_one_line_error(run_cli("train --model " + hf + " --seq-len 16 --eval-every 0" + resume, 120), "--model");
  // Knobs that may change: accepted, and said.
  CliRun ok = run_cli("train --seq-len 16 --eval-every 7 --warmup 2 --steps 4 --resume " + dir, 120);
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("--steps 4 (the checkpoint's run: 2)"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("--eval-every 7 (the checkpoint's run: 0)"), std::string::npos) << ok.out;

  // A token file: another file (or this one changed) under the same flags is refused.
  const std::string tdir = fresh_dir("meaning_data");
  const std::string targs = "train --data " + tokens + " --seq-len 32 --eval-every 0 --eval-fraction 0.1";
  ASSERT_EQ(run_cli(targs + " --steps 2 --save-dir " + tdir, 120).code, 0);
  write_tokens(tokens, 1);
  expect_one_line_error(run_cli(targs + " --steps 3 --resume " + tdir, 120), "--data");
  write_tokens(tokens, 0);
  CliRun same = run_cli(targs + " --steps 3 --resume " + tdir, 120);
  EXPECT_EQ(same.code, 0) << same.err;
  fs::remove_all(dir);
  fs::remove_all(tdir);
  std::remove(tokens.c_str());
}

// A checkpoint written before the data, task and run id were recorded resumes, saying so.
TEST(SaveDirCli, AnOlderCheckpointResumesSayingWhatItCannotCheck) {
  const std::string dir = fresh_dir("older");
  ASSERT_EQ(run_cli(kArgs + " --steps 2 --save-dir " + dir, 120).code, 0);
  const fs::path manifest = fs::path(dir) / "step-00000002" / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(testing::slurp(manifest.string()));
  j.erase("run_id");
  for (const char* k : {"data", "task", "symbols"}) j["run"].erase(k);
  std::ofstream(manifest) << j.dump(2);
  fs::remove(fs::path(dir) / "run.json");
  CliRun r = run_cli(kArgs + " --steps 3 --resume " + dir + " --save-dir " + dir, 120);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("not checked"), std::string::npos) << r.out;
  EXPECT_EQ(latest(dir), "step-00000003");
  fs::remove_all(dir);
}

// `--resume FILE` says it is a file; a binary `latest` is not echoed raw.
TEST(SaveDirCli, ResumeOfAFileOrABinaryLatestIsExplained) {
  const std::string file = fresh_dir("resume_file");
  std::ofstream(file) << "x";
  CliRun r = run_cli(kArgs + " --steps 2 --resume " + file, 60);
  expect_one_line_error(r, "is a file");
  EXPECT_EQ(r.err.find("does not exist"), std::string::npos) << r.err;
  std::remove(file.c_str());
  const std::string dir = fresh_dir("binary_latest");
  fs::create_directories(dir);
  {
    std::ofstream l(fs::path(dir) / "latest", std::ios::binary);
    for (int i = 0; i < 300; ++i) l.put(static_cast<char>(i * 37 + 1));
  }
  CliRun b = run_cli(kArgs + " --steps 2 --resume " + dir, 60);
  expect_one_line_error(b, "latest");
  for (char c : b.err) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "raw byte " << int(c) << " in " << b.err;
  EXPECT_LT(b.err.size(), 400u) << b.err;
  fs::remove_all(dir);
}

// A checkpoint folder's `latest` or manifest.json that is a FIFO: refused by name at once
// (reading `latest` blocked forever in open; a FIFO manifest was reported missing).
TEST(SaveDirCli, FifosInACheckpointFolderAreRefusedNotWaitedOn) {
  const std::string dir = fresh_dir("fifo_latest");
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo((fs::path(dir) / "latest").c_str(), 0600), 0);
  CliRun r = run_cli(kArgs + " --steps 2 --resume " + dir, 20);
  EXPECT_NE(r.code, 124) << "hung on the FIFO";
  expect_one_line_error(r, "a FIFO");
  EXPECT_NE(r.err.find("latest"), std::string::npos) << r.err;
  fs::remove_all(dir);
  const std::string step = fresh_dir("fifo_manifest");
  fs::create_directories(step);
  ASSERT_EQ(::mkfifo((fs::path(step) / "manifest.json").c_str(), 0600), 0);
  CliRun m = run_cli(kArgs + " --steps 2 --resume " + step, 20);
  EXPECT_NE(m.code, 124) << "hung on the FIFO";
  expect_one_line_error(m, "a FIFO");
  EXPECT_NE(m.err.find("manifest.json"), std::string::npos) << m.err;
  fs::remove_all(step);
}

// Rank 1's file damaged: every rank agrees, rank 0 prints the one line, no MPI_Abort.
TEST(SaveDirCli, ADamagedFileOfRankOneIsOneLineUnderMpirun) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string dir = fresh_dir("rank1");
  ASSERT_EQ(testing::run_mpi(kArgs + " --steps 2 --save-dir " + dir, 2, 300).code, 0);
  const fs::path optim = fs::path(dir) / "step-00000002" / "rank-00001.optim.safetensors";
  {
    std::fstream f(optim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(optim) / 2));
    f.put('\x5a');
  }
  CliRun r = testing::run_mpi(kArgs + " --steps 3 --resume " + dir, 2, 300);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_EQ(occurrences(r.err, "peakbound: error: "), 1) << r.err;
  EXPECT_NE(r.err.find("rank-00001.optim.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
