// train's plan covers its held-out evaluation (issue 25): a one-rank vocabulary group under
// Ring-DTP trains with the fused loss but evaluates with the plain forward (its logits
// block, lse and running statistics), which the plan used to leave out (vocab 32.00 KiB
// planned, 32.75 KiB measured on the Hugging Face fixture at 32 tokens). Every row but
// dispatch (a bound on the routing) is the plan exactly, with and without evaluation.
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::last_json_line;
using testing::run_cli;

const std::string kFixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";

void expect_exact_but_dispatch(const std::string& args, bool evaluated) {
  SCOPED_TRACE(args);
  const CliRun r = run_cli(args + " --json", 180);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(j.contains("eval_loss"), evaluated);
  const nlohmann::json& peaks = j.at("peaks");
  ASSERT_TRUE(peaks.contains("vocab"));
  EXPECT_GT(peaks["vocab"]["measured_bytes"].get<std::int64_t>(), 0);
  for (const auto& [name, row] : peaks.items()) {
    if (name == "dispatch" || name == "total") continue;
    EXPECT_EQ(row.at("planned_bytes").get<std::int64_t>(), row.at("measured_bytes").get<std::int64_t>()) << name;
  }
}

TEST(EvalFootprintCli, PlannedVocabEqualsMeasuredWhenTheRunEvaluates) {
  // One rank, schedules all: Ring-DTP's fused training loss, the plain forward for the eval;
  // in both precisions (bf16: the footprints' fp32 tiles and bf16 rows, train_footprint).
  for (const char* p : {" --precision f32", " --precision bf16"}) {
    expect_exact_but_dispatch("train --model " + kFixture + " --steps 2 --seq-len 32 --eval-every 1" + p, true);
    expect_exact_but_dispatch("train --model " + kFixture + " --steps 1 --seq-len 32 --eval-batches 0" + p, false);
    expect_exact_but_dispatch(std::string("train --steps 1 --seq-len 64 --eval-every 1") + p, true);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
