// Regressions for the planner's defects found by trying it as a careless user would:
// each bad input is one line naming the problem, never a crash, a hang, or a wrapped
// number reported as "fits: yes". Every run is under a timeout (run_cli).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::expect_one_line_error;
using testing::run_cli;

TEST(PlanDefects, HugeCountsAreRefusedNotClampedOrDividedByZero) {
  // Was SIGFPE: clamped to INT64_MAX, then the --cp doubling overflowed to 0.
  expect_one_line_error(run_cli("plan --model tiny-moe --devices 99999999999999999999 --context 16M"), "--devices");
  expect_one_line_error(run_cli("plan --model tiny-moe --devices 9223372036854775807 --context 16M"), "--devices");
  expect_one_line_error(run_cli("plan --sequences 99999999999999999999"), "--sequences");
  expect_one_line_error(run_cli("plan --dispatch-cap 99999999999999999999"), "--dispatch-cap");
}

TEST(PlanDefects, OverflowingContextIsAnErrorNotAPlan) {
  // Was "fits: yes" with a peak smaller than single components (64-bit sums wrapped).
  expect_one_line_error(run_cli("plan --context 4611686018427387904"), "context");
  expect_one_line_error(run_cli("plan --seq-len 1e18"), "--seq-len");
  // Byte sizes between 2^63 and 2^64 became 2^63.
  expect_one_line_error(run_cli("plan --device-memory 9300000000000000000"), "out of range");
  expect_one_line_error(run_cli("plan --device-memory 18446744073709551615"), "out of range");
}

TEST(PlanDefects, EmptyNanAndInfinityAreRefused) {
  expect_one_line_error(run_cli("plan --fsdp ''"), "--fsdp");
  expect_one_line_error(run_cli("plan --schedules ''"), "--schedules");
  expect_one_line_error(run_cli("plan --skew inf"), "--skew");
  expect_one_line_error(run_cli("plan --skew 1e18"), "--skew");
  expect_one_line_error(run_cli("plan --skew nan"), "--skew");
  expect_one_line_error(run_cli("plan --llep-alpha inf"), "--llep-alpha");
  expect_one_line_error(run_cli("plan --llep-alpha nan"), "--llep-alpha");
  expect_one_line_error(run_cli("plan --prefetch-depth -2"), "--prefetch-depth");
}

TEST(PlanDefects, DtypeErrorsNameTheFlagAndOnlyWhatItTakes) {
  testing::CliRun r = run_cli("plan --param-dtype f16");
  expect_one_line_error(r, "--param-dtype");
  EXPECT_NE(r.err.find("bf16 or f32"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("i32"), std::string::npos) << r.err;
  expect_one_line_error(run_cli("plan --grad-dtype i32"), "--grad-dtype");
  r = run_cli("bench optimizer --param-dtype f16");
  expect_one_line_error(r, "--param-dtype");
  EXPECT_EQ(r.err.find("i32"), std::string::npos) << r.err;
}

TEST(PlanDefects, HostMemoryIsCheckedAgainstTheNode) {
  // Was: 763 GiB of host memory per device reported and never checked ("fits: yes").
  // bf16 gradients keep this an estimate: the trainer's footprint of 256 devices (64
  // distinct ranks, the selective SCO policy's search) takes more than ten minutes.
  // A boundary per layer (--checkpoint-group 1: the policy's groups would make it fit).
  testing::CliRun r = run_cli(
      "plan --model qwen3-235b-a22b --context 1M --devices 256 --device-memory 141GiB --grad-dtype bf16 "
      "--checkpoint-group 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["fits_host"]["scheduled"].get<bool>());
  EXPECT_FALSE(j["fits"]["scheduled"].get<bool>());
  EXPECT_EQ(j["host_binding_component"]["scheduled"], "checkpoints");
  EXPECT_EQ(j["layout"]["devices_per_node"], 8);
  // The policy's: one boundary per group of layers, and the host holds them.
  r = run_cli("plan --model qwen3-235b-a22b --context 1M --devices 256 --device-memory 141GiB --grad-dtype bf16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits_host"]["scheduled"].get<bool>());
  EXPECT_GT(j["knobs"]["checkpoint_group"].get<int>(), 1);
  expect_one_line_error(run_cli("plan --checkpoint-group 0"), "checkpoint_group");
  expect_one_line_error(run_cli("plan --model tiny-moe --checkpoint-group 9"), "checkpoint_group");
  r = run_cli(
      "plan --model qwen3-235b-a22b --context 1M --devices 256 --device-memory 141GiB --host-memory 0 --grad-dtype bf16 "
      "--json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["fits_host"]["scheduled"].get<bool>());
  expect_one_line_error(run_cli("plan --devices-per-node 0"), "--devices-per-node");
  expect_one_line_error(run_cli("plan --resident-layers -5"), "--resident-layers");
  expect_one_line_error(run_cli("plan --model tiny-moe --resident-layers 1000"), "resident_layers");
}

class PlanModelFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/pb_plan_models_" + std::to_string(::getpid());
    ASSERT_EQ(std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str()), 0);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(PlanModelFiles, OddFilesAreOneLineErrors) {
  ASSERT_EQ(::symlink("loop_b", (dir_ + "/loop_a").c_str()), 0);
  ASSERT_EQ(::symlink("loop_a", (dir_ + "/loop_b").c_str()), 0);
  expect_one_line_error(run_cli("plan --model " + dir_ + "/loop_a"), "symbolic links");  // was exit 3
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  expect_one_line_error(run_cli("plan --model " + dir_ + "/fifo", 20), "not a regular file");  // blocked reading
  {
    std::ofstream bin(dir_ + "/binary.json", std::ios::binary);
    for (int i = 0; i < 512; ++i) bin.put(static_cast<char>((i * 37 + 11) % 256));
  }
  testing::CliRun r = run_cli("plan --model " + dir_ + "/binary.json");
  expect_one_line_error(r, "invalid JSON");  // raw bytes were echoed
  for (char c : r.err) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  ASSERT_EQ(::mkdir((dir_ + "/folder").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir_ + "/folder/config.json").c_str(), 0700), 0);
  r = run_cli("plan --model " + dir_ + "/folder/config.json");
  expect_one_line_error(r, "directory");
  EXPECT_EQ(r.err.find("config.json/config.json"), std::string::npos) << r.err;
}

TEST_F(PlanModelFiles, AbsurdLayerCountsAreRefusedAtOnce) {
  // Was a loop over 1e15 layers (qwen3_moe), and unbounded memory for deepseek_v3.
  const std::string qwen = R"({"model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 64,
    "num_hidden_layers": 1e15, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 64})";
  std::ofstream(dir_ + "/qwen.json") << qwen;
  expect_one_line_error(run_cli("plan --model " + dir_ + "/qwen.json", 20), "num_hidden_layers");
  const std::string ds = R"({"model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 64,
    "num_hidden_layers": 1000000000000, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 64,
    "first_k_dense_replace": 1, "moe_layer_freq": 2, "n_shared_experts": 1})";
  std::ofstream(dir_ + "/ds.json") << ds;
  expect_one_line_error(run_cli("plan --model " + dir_ + "/ds.json", 20), "num_hidden_layers");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
