// `peakbound plan --trainer-defaults` on a run `peakbound train` executes prints the
// same per-component device peaks as `train`'s own printed plan (its "planned" column,
// the trainer's footprint at the worst routing skew): one rank, and two ranks under
// context parallelism when mpirun is there. A bf16 plan of the same run stays an
// estimate and says why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/cli/run_cli.h"

namespace {

using peakbound::testing::last_json_line;
using peakbound::testing::CliRun;
using peakbound::testing::run_cli;
using peakbound::testing::run_mpi;

const char* const kComponents[] = {"params", "grads",  "optimizer", "checkpoints", "dispatch", "vocab",
                                   "attention", "layer", "comm", "workspace"};

// plan's scheduled per-component bytes and peak == train's planned bytes (train lists
// only the components with bytes).
void expect_same_numbers(const CliRun& plan, const CliRun& train, const std::string& what) {
  ASSERT_EQ(plan.code, 0) << what << ": " << plan.err;
  ASSERT_EQ(train.code, 0) << what << ": " << train.err;
  const nlohmann::json p = nlohmann::json::parse(plan.out);
  const nlohmann::json t = last_json_line(train.out)["peaks"];
  EXPECT_EQ(p["source"]["scheduled"], "trainer_footprint") << what << ": " << p["estimate_reason"];
  for (const char* c : kComponents) {
    const std::uint64_t planned = p["components"][c]["scheduled_bytes"];
    const std::uint64_t trained = t.contains(c) ? t[c]["planned_bytes"].get<std::uint64_t>() : 0;
    EXPECT_EQ(planned, trained) << what << ": " << c;
  }
  EXPECT_EQ(p["peak_bytes"]["scheduled"].get<std::uint64_t>(), t["total"]["planned_bytes"].get<std::uint64_t>())
      << what << ": total";
}

TEST(PlanTrainer, OneRankMatchesTrainsPrintedPlan) {
  for (const char* sched : {"all", "none"}) {
    const std::string s = sched;
    CliRun plan = run_cli("plan --model tiny-moe --devices 1 --context 96 --schedules " + s + " --trainer-defaults --json");
    CliRun train = run_cli("train --model tiny-moe --steps 1 --seq-len 96 --schedules " + s + " --eval-every 0 --json", 300);
    expect_same_numbers(plan, train, "1 rank, schedules " + s);
  }
}

TEST(PlanTrainer, TwoRanksContextParallelMatchesTrainsPrintedPlan) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  CliRun plan = run_cli(
      "plan --model tiny-moe --devices 2 --ep 2 --cp 2 --vocab-group 2 --context 90 --schedules all --trainer-defaults --json");
  CliRun train = run_mpi("train --model tiny-moe --steps 1 --seq-len 90 --cp 2 --schedules all --eval-every 0 --json", 2, 300);
  expect_same_numbers(plan, train, "2 ranks, cp 2");
}

TEST(PlanTrainer, Bf16PlanIsAnEstimateAndSaysWhy) {
  CliRun r = run_cli("plan --model tiny-moe --devices 1 --context 96 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out);
  EXPECT_EQ(p["source"]["scheduled"], "estimate");
  EXPECT_NE(p["estimate_reason"].get<std::string>().find("f32"), std::string::npos) << p["estimate_reason"];
  r = run_cli("plan --model tiny-moe --devices 1 --context 96 --trainer-defaults");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("source       the trainer's footprint"), std::string::npos) << r.out;
}

}  // namespace
