// Runs the built `peakbound` binary as a user would and checks exit codes and
// that errors are one line on stderr (no stack trace, no abort).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::CliRun;
using peakbound::testing::expect_one_line_error;
CliRun run(const std::string& args) { return peakbound::testing::run_cli(args); }

TEST(Cli, VersionAndHelp) {
  CliRun v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("peakbound 0."), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("blas: OpenBLAS"), std::string::npos) << v.out;
  CliRun h = run("--help");
  EXPECT_EQ(h.code, 0);
  for (const char* sub : {"plan", "train", "bench", "verify", "demo", "info"})
    EXPECT_NE(h.out.find(sub), std::string::npos) << sub;
}

// info times a GEMM at each precision and names the bf16 path; a bad path in the
// environment is one line, not an abort.
TEST(Cli, InfoTimesBothPrecisionsAndNamesTheBf16Path) {
  CliRun r = run("info --json --gemm-size 96 --gemm-repeats 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& g = j.at("gemm");
  EXPECT_GT(g.at("f32_flops_per_second").get<double>(), 0.0);
  EXPECT_GT(g.at("bf16_flops_per_second").get<double>(), 0.0);
  EXPECT_EQ(g.at("bf16_path"), j.at("bf16_gemm_path"));
  EXPECT_GE(g.at("gemm_peak_flops_per_second").get<double>(), g.at("f32_flops_per_second").get<double>());
  const std::string path = j.at("bf16_gemm_path");
  EXPECT_TRUE(path == "amx" || path == "native" || path == "convert") << path;
  CliRun text = run("info --gemm-size 0");
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("bf16 gemm: " + path), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("GFLOP/s"), std::string::npos) << "--gemm-size 0 times nothing";
  // The single-copy probe: one word, the same in the JSON and the text.
  CliRun copy = run("info --mpi-single-copy");
  ASSERT_EQ(copy.code, 0) << copy.err;
  EXPECT_TRUE(copy.out == "cma\n" || copy.out == "none\n") << copy.out;
  const std::string mech = copy.out.substr(0, copy.out.size() - 1);
  EXPECT_EQ(j.at("mpi_single_copy"), mech);
  EXPECT_NE(text.out.find("mpi single copy: " + mech), std::string::npos) << text.out;
  expect_one_line_error(
      peakbound::testing::run_cli("", 30, "env PEAKBOUND_BF16_GEMM=fastest " + std::string(PEAKBOUND_CLI_PATH) + " info"),
      "PEAKBOUND_BF16_GEMM");
}

TEST(Cli, UnknownFlagIsOneLine) { expect_one_line_error(run("--frobnicate"), "frobnicate"); }

TEST(Cli, UnknownSubcommandIsOneLine) { expect_one_line_error(run("launch-rockets"), "launch-rockets"); }

TEST(Cli, BadFlagValueIsOneLine) {
  expect_one_line_error(run("demo --layers zero"), "--layers");
  expect_one_line_error(run("demo --device-memory 12parsecs"), "--device-memory");
}

TEST(Cli, OutOfBudgetIsOneLineNamingTheComponent) {
  CliRun r = run("demo --device-memory 1MiB --tokens 1024 --hidden 256");
  expect_one_line_error(r, "budget");
  EXPECT_NE(r.err.find("'params'"), std::string::npos) << r.err;  // the first allocation to fail
}

TEST(Cli, TrainRefusesBadInputInOneLine) {
  expect_one_line_error(run("train --schedules llep,warp"), "warp");
  expect_one_line_error(run("train --model no-such-model"), "no-such-model");
  expect_one_line_error(run("train --ep 3"), "--ep 3");
  expect_one_line_error(run("train --seq-len 4"), "--seq-len");
  expect_one_line_error(run("train --lr 1e-3 --min-lr 1e-2"), "--min-lr");
  expect_one_line_error(run("train --symbols 20000"), "symbols");
  expect_one_line_error(run("train --data /no/such/file.bin --steps 1"), "/no/such/file.bin");
}

TEST(Cli, GroupsNeedACase) {
  expect_one_line_error(run("bench"), "needs one of:");
  expect_one_line_error(run("verify warp-drive"), "warp-drive");
  expect_one_line_error(run("bench vocab --tokens -3"), "--tokens");
}

TEST(Cli, VerifyVocabAndDispatchPassAsOneRank) {
  CliRun v = run("verify vocab --tokens 20 --vocab 77 --chunk 6 --z-loss 0.001 --ignore-fraction 0.2");
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("verify vocab: pass"), std::string::npos) << v.out;
  CliRun d = run("verify dispatch --tokens 20 --skew hot,source");
  EXPECT_EQ(d.code, 0) << d.out << d.err;
  EXPECT_NE(d.out.find("verify dispatch: pass"), std::string::npos) << d.out;
}

TEST(Cli, DemoRunsAndGradientsMatchBitwise) {
  CliRun r = run("demo --layers 3 --tokens 64 --hidden 32 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"grads_bitwise_equal\": true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"checkpoint_peak_reduction\""), std::string::npos);
}

}  // namespace PB_TEST_FILE
}  // namespace

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(CliPlan, PresetWithReachAsJson) {
  CliRun r = run("plan --model deepseek-v3 --seq-len 1M --devices 256 --device-memory 141GiB --reach --json");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* k : {"\"params_total\"", "\"reach_ratio\"", "\"binding_component\"", "\"fits\""})
    EXPECT_NE(r.out.find(k), std::string::npos) << k;
}

TEST(CliPlan, BadInputsAreOneLine) {
  expect_one_line_error(run("plan --model llama-9000"), "llama-9000");
  expect_one_line_error(run("plan --model mixtral-8x22b --devices 6 --ep 3"), "experts");
  expect_one_line_error(run("plan --seq-len 12Q"), "--seq-len");
  expect_one_line_error(run("plan --context 12Q"), "--seq-len");  // the old name of the same flag
  expect_one_line_error(run("plan --device-memory lots"), "--device-memory");
  expect_one_line_error(run("plan --schedules warp"), "warp");
  expect_one_line_error(run("plan --model /nonexistent/config.json"), "/nonexistent/config.json");
}

}  // namespace PB_TEST_FILE
}  // namespace

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/pb_cli_config_" + name;
  std::ofstream(path) << text;
  return path;
}

// `plan --config FILE` (cli/config_file.h): the same plan as the flags, the command line
// overriding the file, and bad files as one-line errors naming the file.
TEST(CliPlan, ConfigFileGivesTheSameFlags) {
  const std::string flags = "--model mixtral-8x22b --context 64K --devices 16 --device-memory 80GiB --schedules llep,sco";
  CliRun direct = run("plan " + flags + " --reach --json");
  ASSERT_EQ(direct.code, 0) << direct.err;
  const std::string toml = write_file("plan.toml",
                                      "# plan of a small cluster\nmodel = \"mixtral-8x22b\"\ncontext = \"64K\"\n"
                                      "devices = 16\ndevice-memory = \"80GiB\"\nschedules = \"llep,sco\"\nreach = true\n"
                                      "json = true\n");
  const std::string json = write_file("plan.json", R"({"model": "mixtral-8x22b", "context": "64K", "devices": 16,
    "device-memory": "80GiB", "schedules": "llep,sco", "reach": true, "json": true})");
  for (const std::string& file : {toml, json}) {
    CliRun r = run("plan --config " + file);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(r.out == direct.out) << file;
  }
  // The command line wins over the file.
  CliRun over = run("plan --config " + toml + " --devices 32");
  std::string flags32 = flags;
  flags32.replace(flags32.find("--devices 16"), 12, "--devices 32");
  CliRun over_direct = run("plan " + flags32 + " --reach --json");
  ASSERT_EQ(over.code, 0) << over.err;
  ASSERT_EQ(over_direct.code, 0) << over_direct.err;
  EXPECT_TRUE(over.out == over_direct.out);
  EXPECT_TRUE(over.out != direct.out);
}

TEST(CliPlan, BadConfigFilesAreOneLine) {
  const std::string unknown = write_file("unknown.toml", "devices = 16\nstepz = 3\n");
  expect_one_line_error(run("plan --config " + unknown), unknown + ":2: unknown key 'stepz'");
  const std::string range = write_file("range.json", R"({"devices": 0})");
  expect_one_line_error(run("plan --config " + range), range + ": --devices must be");
  const std::string table = write_file("table.toml", "[plan]\ndevices = 16\n");
  expect_one_line_error(run("plan --config " + table), table + ":1: tables");
  const std::string value = write_file("value.toml", "device-memory = \"lots\"\n");
  expect_one_line_error(run("plan --config " + value), "--device-memory");  // checked when the plan runs
  expect_one_line_error(run("plan --config /nonexistent/plan.toml"), "/nonexistent/plan.toml: cannot read");
}

}  // namespace PB_TEST_FILE
}  // namespace
