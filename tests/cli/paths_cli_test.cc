// The paths a careless user gives, through the binary: an output that is the same file
// as an input (the token file, the model's config.json or weights, the other output, a
// per-rank timeline file) is refused before anything is opened for writing and the
// input is left intact; a FIFO or a folder where a file is read or written is a one-line
// error, never a hang (each run under a short timeout).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "peakbound/io/token_file.h"
#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::CliRun;
using peakbound::testing::expect_one_line_error;
using peakbound::testing::run_cli;

namespace fs = std::filesystem;

// A folder with a token file (data.bin), a copy of the small Hugging Face model
// (model/), a plain file (t.json) and a FIFO (fifo).
struct Scratch {
  std::string dir;
  explicit Scratch(const std::string& name)
      : dir(::testing::TempDir() + "/pb_pathcli_" + name + "_" + std::to_string(::getpid())) {
    fs::remove_all(dir);
    fs::create_directories(dir + "/sub");
    std::vector<std::int32_t> t(4000);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>(i * 7 % 200);
    peakbound::write_token_file(dir + "/data.bin", t.data(), static_cast<std::int64_t>(t.size()));
    fs::copy(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe", dir + "/model");
    std::ofstream(dir + "/t.json") << "{}\n";
    ::mkfifo((dir + "/fifo").c_str(), 0600);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return dir + "/" + name; }
};

constexpr int kTimeout = 60;  // every case is refused before step 1: seconds, not minutes
const std::string kTrain = "train --steps 1 --seq-len 16 --eval-every 0 ";

TEST(PathsCli, MetricsOntoTheTokenFileIsRefusedAndTheFileKept) {
  Scratch s("metrics_data");
  const auto bytes = fs::file_size(s / "data.bin");
  for (const std::string& spelled : {s / "data.bin", s / "sub/../data.bin", s / "./data.bin"}) {
    const CliRun r = run_cli(kTrain + "--data " + (s / "data.bin") + " --metrics " + spelled, kTimeout);
    expect_one_line_error(r, "--metrics '" + spelled + "' is the same file as --data '" + (s / "data.bin") +
                                 "': writing it would destroy that input");
    EXPECT_EQ(fs::file_size(s / "data.bin"), bytes) << spelled;  // not truncated
  }
}

TEST(PathsCli, OutputsOntoInputsOrEachOtherAreRefused) {
  Scratch s("onto");
  const auto data_bytes = fs::file_size(s / "data.bin");
  const auto config_bytes = fs::file_size(s / "model/config.json");
  const auto weight_bytes = fs::file_size(s / "model/model.safetensors");
  expect_one_line_error(run_cli(kTrain + "--data " + (s / "data.bin") + " --memory-timeline " + (s / "data.bin"), kTimeout),
                        "--memory-timeline '" + (s / "data.bin") + "' is the same file as --data");
  expect_one_line_error(run_cli(kTrain + "--model " + (s / "model") + " --metrics " + (s / "model/config.json"), kTimeout),
                        "is the same file as --model's config.json");
  expect_one_line_error(
      run_cli(kTrain + "--model " + (s / "model") + " --memory-timeline " + (s / "model/model.safetensors"), kTimeout),
      "is the same file as --model's model.safetensors");
  std::ofstream(s / "c.toml") << "steps = 1\n";
  expect_one_line_error(run_cli(kTrain + "--config " + (s / "c.toml") + " --metrics " + (s / "c.toml"), kTimeout),
                        "--metrics '" + (s / "c.toml") + "' is the same file as --config");
  EXPECT_EQ(peakbound::testing::slurp(s / "c.toml"), "steps = 1\n");
  expect_one_line_error(run_cli(kTrain + "--metrics " + (s / "m.json") + " --memory-timeline " + (s / "sub/../m.json"), kTimeout),
                        "--memory-timeline '" + (s / "sub/../m.json") + "' is the same file as --metrics '" +
                            (s / "m.json") + "': each output needs a file of its own");
  EXPECT_FALSE(fs::exists(s / "m.json"));  // refused before anything was written
  EXPECT_EQ(fs::file_size(s / "data.bin"), data_bytes);
  EXPECT_EQ(fs::file_size(s / "model/config.json"), config_bytes);
  EXPECT_EQ(fs::file_size(s / "model/model.safetensors"), weight_bytes);

  expect_one_line_error(run_cli("plot-memory " + (s / "t.json") + " -o " + (s / "t.json"), kTimeout),
                        "--out '" + (s / "t.json") + "' is the same file as plot-memory '" + (s / "t.json") + "'");
  fs::copy_file(s / "t.json", s / "t.svg");  // the default output (the input's name with .svg) is the input
  expect_one_line_error(run_cli("plot-memory " + (s / "t.svg"), kTimeout), "is the same file as plot-memory");
  EXPECT_EQ(peakbound::testing::slurp(s / "t.json"), "{}\n");
}

TEST(PathsCli, APerRankTimelineFileOverTheMetricsIsRefused) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  Scratch s("rank");
  // Two ranks write t.rank-0.json and t.rank-1.json: the second is the metrics file.
  const CliRun r = peakbound::testing::run_mpi(
      kTrain + "--metrics " + (s / "t.rank-1.json") + " --memory-timeline " + (s / "t.json"), 2, 120);
  // mpirun adds its own lines about the exit code: one error line from peakbound.
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (a hang)";
  const std::string line = "peakbound: error: --memory-timeline '" + (s / "t.rank-1.json") + "' is the same file as --metrics";
  EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("peakbound: error: "), r.err.rfind("peakbound: error: ")) << r.err;  // once, from rank 0
  EXPECT_FALSE(fs::exists(s / "t.rank-0.json"));
}

TEST(PathsCli, FifosAreRefusedNotWaitedOn) {
  Scratch s("fifo");
  const std::string fifo = s / "fifo";
  for (const std::string& args :
       {kTrain + "--metrics " + fifo, kTrain + "--memory-timeline " + fifo, kTrain + "--data " + fifo,
        kTrain + "--config " + fifo, "eval --data " + fifo, "plot-memory " + fifo,
        "plot-memory " + (s / "t.json") + " -o " + fifo, "bench reach --peer-json " + fifo}) {
    SCOPED_TRACE(args);
    const CliRun r = run_cli(args, 30);
    expect_one_line_error(r, fifo);
    EXPECT_NE(r.err.find("FIFO"), std::string::npos) << r.err;
  }
  struct stat sb {};
  ASSERT_EQ(::stat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode));  // still a FIFO: nothing renamed over it
}

TEST(PathsCli, FoldersWhereAFileIsExpectedAreOneLine) {
  Scratch s("dir");
  expect_one_line_error(run_cli("plot-memory " + (s / "sub"), kTimeout),
                        "plot-memory '" + (s / "sub") + "' is a directory, expected the JSON written by --memory-timeline");
  expect_one_line_error(run_cli(kTrain + "--metrics " + (s / "sub"), kTimeout), "--metrics '" + (s / "sub") + "' is a directory");
  expect_one_line_error(run_cli(kTrain + "--memory-timeline " + (s / "sub"), kTimeout),
                        "--memory-timeline '" + (s / "sub") + "' is a directory");
  expect_one_line_error(run_cli(kTrain + "--metrics " + (s / "nowhere/m.jsonl"), kTimeout),
                        "the folder '" + (s / "nowhere") + "' does not exist");
  EXPECT_TRUE(fs::is_directory(s / "sub"));
}

TEST(PathsCli, CheckpointFilesAreInputsOfExportAndResume) {
  Scratch s("export");
  const CliRun t = run_cli(kTrain + "--model " + (s / "model") + " --save-dir " + (s / "ck"), 120);
  ASSERT_EQ(t.code, 0) << t.err;
  const std::string step = (s / "ck/step-00000001");
  ASSERT_TRUE(fs::is_directory(step));
  expect_one_line_error(run_cli("export --checkpoint " + (s / "ck") + " --hf " + step, kTimeout),
                        "is the checkpoint's own folder");
  expect_one_line_error(run_cli("export --checkpoint " + (s / "ck") + " --hf " + (s / "data.bin"), kTimeout),
                        "--hf '" + (s / "data.bin") + "' is a file, expected a folder");
  fs::create_directories(s / "out");
  ::mkfifo((s / "out/config.json").c_str(), 0600);
  expect_one_line_error(run_cli("export --checkpoint " + (s / "ck") + " --hf " + (s / "out"), 30),
                        "--hf '" + (s / "out/config.json") + "' is a FIFO");
  EXPECT_FALSE(fs::exists(s / "out/model.safetensors"));
  EXPECT_TRUE(fs::is_fifo(s / "out/config.json"));
  // --dtype: bf16 or f32 (default the source model's: the fixture is float32); anything else is one line.
  expect_one_line_error(
      run_cli("export --checkpoint " + (s / "ck") + " --hf " + (s / "half") + " --dtype f16", kTimeout),
      "--dtype: 'f16' is not a dtype it takes (use bf16 or f32)");
  EXPECT_FALSE(fs::exists(s / "half"));
  for (const char* dtype : {"bf16", ""}) {
    const std::string flag = *dtype ? std::string(" --dtype ") + dtype : "";
    const CliRun e = run_cli("export --checkpoint " + (s / "ck") + " --hf " + (s / "hf") + flag, kTimeout);
    ASSERT_EQ(e.code, 0) << e.err;
    EXPECT_NE(e.out.find(*dtype ? "model.safetensors in bf16)" : "model.safetensors in f32)"), std::string::npos)
        << e.out;
    const std::string config = peakbound::testing::slurp(s / "hf/config.json");
    EXPECT_NE(config.find(*dtype ? "\"dtype\": \"bfloat16\"" : "\"dtype\": \"float32\""), std::string::npos)
        << config;
  }
  // A resumed run reads (maps) the checkpoint's files: none of them is an output.
  const auto weights = fs::file_size(step + "/rank-00000.model.safetensors");
  expect_one_line_error(run_cli("train --steps 2 --seq-len 16 --eval-every 0 --model " + (s / "model") + " --resume " +
                                    (s / "ck") + " --metrics " + step + "/rank-00000.model.safetensors",
                                kTimeout),
                        "is the same file as --resume's checkpoint file");
  EXPECT_EQ(fs::file_size(step + "/rank-00000.model.safetensors"), weights);
}

}  // namespace PB_TEST_FILE
}  // namespace
