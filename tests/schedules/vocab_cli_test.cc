// `peakbound verify vocab` and `bench vocab` as a user runs them: knobs refused with a
// one-line error before any work (issue 17: a NaN z-loss used to surface later as a
// numerical MISMATCH; an empty number used to read as 0), and a device budget sized from
// the footprints, so tiny shapes run under a small address-space limit (they used to
// reserve a fixed 16 GiB).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::CliRun;
using peakbound::testing::expect_one_line_error;
CliRun run(const std::string& args) { return peakbound::testing::run_cli(args); }

// The same run under `ulimit -v` (KiB of address space).
CliRun run_limited(const std::string& args, long kib) { return peakbound::testing::run_limited(args, kib); }

TEST(VocabCli, NonFiniteZLossIsRefused) {
  for (const char* cmd : {"verify vocab", "bench vocab --reps 1"}) {
    expect_one_line_error(run(std::string(cmd) + " --tokens 8 --vocab 50 --z-loss nan"), "--z-loss");
    expect_one_line_error(run(std::string(cmd) + " --tokens 8 --vocab 50 --z-loss inf"), "--z-loss");
    expect_one_line_error(run(std::string(cmd) + " --tokens 8 --vocab 50 --z-loss -inf"), "--z-loss");
  }
  CliRun r = run("verify vocab --z-loss nan");
  EXPECT_EQ(r.out, "") << "refused before any run";
}

TEST(VocabCli, EmptyNumbersAreRefused) {
  for (const char* flag : {"--chunk", "--tokens", "--hidden", "--vocab", "--z-loss", "--ignore-fraction", "--seed"}) {
    expect_one_line_error(run(std::string("verify vocab ") + flag + " \"\""), flag);
    expect_one_line_error(run(std::string("bench vocab --reps 1 ") + flag + " \"\""), flag);
  }
}

TEST(VocabCli, BadModeNamesTheFlag) { expect_one_line_error(run("verify vocab --mode sideways"), "--mode 'sideways'"); }

TEST(VocabCli, TinyShapesRunUnderASmallAddressSpace) {
  if (!peakbound::testing::address_space_limits_apply()) GTEST_SKIP() << "sanitizer build: ulimit -v cannot apply";
  CliRun v = run_limited("verify vocab --tokens 20 --vocab 77 --chunk 6 --z-loss 0.001", 2L << 20);
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("verify vocab: pass"), std::string::npos) << v.out;
  CliRun b = run_limited("bench vocab --tokens 64 --vocab 256 --hidden 16 --reps 1 --json", 2L << 20);
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  const auto j = nlohmann::json::parse(b.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const auto& run : j["runs"])  // the measured peak is the footprint's
    EXPECT_EQ(run["vocab_peak_bytes"], run["footprint_vocab_peak_bytes"]) << run.dump();
}

TEST(VocabCli, DeviceMemoryCanBeSetAndBinds) {
  CliRun ok = run("verify vocab --tokens 20 --vocab 77 --device-memory 64MiB");
  EXPECT_EQ(ok.code, 0) << ok.err;
  // The budget binds: it is refused by the first allocation it cannot hold (now the
  // rank's inputs, which live on the device too).
  expect_one_line_error(run("verify vocab --tokens 20 --vocab 77 --device-memory 4KiB"), "budget");
  expect_one_line_error(run("bench vocab --device-memory 12parsecs"), "--device-memory");
}

// bf16 over a vocabulary group of 3 with the kept logits beside: three runs, each peak its
// footprint's, the kept form the recomputing one's bits at 3 GEMMs for 4 and a larger
// peak, bf16 within bf16's rounding of the baseline; a bad precision is one line.
TEST(VocabCli, Bf16AndTheKeptLogitsSideBySide) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  CliRun b = peakbound::testing::run_mpi(
      "bench vocab --tokens 37 --vocab 301 --hidden 24 --chunk 16 --reps 1 --precision bf16 --keep-logits --json", 3);
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  const auto j = nlohmann::json::parse(b.out);  // rank 0's object, the only output
  EXPECT_EQ(j["precision"], "bf16");
  ASSERT_EQ(j["runs"].size(), 3u) << j.dump();
  for (const auto& run : j["runs"]) EXPECT_EQ(run["vocab_peak_bytes"], run["footprint_vocab_peak_bytes"]) << run.dump();
  EXPECT_GT(j["runs"][2]["vocab_peak_bytes"].get<double>(), j["runs"][1]["vocab_peak_bytes"].get<double>());
  const auto& k = j["kept_logits"];
  EXPECT_TRUE(k["same_loss_bits"].get<bool>()) << k.dump();
  EXPECT_EQ(k["max_rel_err_dhidden_vs_recompute"].get<double>(), 0.0) << k.dump();
  EXPECT_EQ(k["max_rel_err_dweight_vs_recompute"].get<double>(), 0.0) << k.dump();
  EXPECT_DOUBLE_EQ(k["gemm_flops_ratio_vs_recompute"].get<double>(), 0.75) << k.dump();
  EXPECT_LT(j["max_rel_err_loss"].get<double>(), 1e-3) << j.dump();
  EXPECT_LT(j["max_rel_err_dhidden"].get<double>(), 2e-2) << j.dump();
  expect_one_line_error(run("bench vocab --precision fp8"), "--precision");
  expect_one_line_error(run("bench vocab --keep-logits"), "--keep-logits: one rank");  // the fused form keeps nothing
}

}  // namespace PB_TEST_FILE
}  // namespace
