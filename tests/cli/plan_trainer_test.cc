// `peakbound plan --trainer-defaults` on a run `peakbound train` executes prints the
// same per-component device peaks as `train`'s own printed plan (its "planned" column,
// the trainer's footprint at the worst routing skew): one rank, and two ranks under
// context parallelism when mpirun is there, in both precisions (--precision). bf16
// gradients stay an estimate and say why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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

// In both precisions: --precision goes to train and to plan (whose --trainer-defaults
// keeps it), and the bf16 plan is the trainer's own bf16 footprint.
TEST(PlanTrainer, OneRankMatchesTrainsPrintedPlan) {
  for (const char* prec : {"f32", "bf16"})
    for (const char* sched : {"all", "none"}) {
      const std::string s = sched, p = prec;
      CliRun plan = run_cli("plan --model tiny-moe --devices 1 --context 96 --schedules " + s + " --precision " + p +
                            " --trainer-defaults --json");
      CliRun train = run_cli("train --model tiny-moe --steps 1 --seq-len 96 --schedules " + s + " --precision " + p +
                                 " --eval-every 0 --json",
                             300);
      expect_same_numbers(plan, train, "1 rank, schedules " + s + ", " + p);
    }
}

TEST(PlanTrainer, TwoRanksContextParallelMatchesTrainsPrintedPlan) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  for (const char* prec : {"f32", "bf16"}) {
    const std::string p = prec;
    CliRun plan = run_cli("plan --model tiny-moe --devices 2 --ep 2 --cp 2 --vocab-group 2 --context 90 --schedules all "
                          "--trainer-defaults --json --precision " + p);
    CliRun train = run_mpi(
        "train --model tiny-moe --steps 1 --seq-len 90 --cp 2 --schedules all --eval-every 0 --json --precision " + p, 2,
        300);
    expect_same_numbers(plan, train, "2 ranks, cp 2, " + p);
  }
}

// Ulysses (--context-attention ulysses) at 2 ranks, cp 2, both precisions: plan's numbers
// are train's printed plan, train measures what it planned, and the losses are the ring's
// (f32 to 1e-6 relative: the attention's sums reorder; bf16 to 1e-3). The JSON says which
// attention ran. Values outside ring|ulysses and heads cp cannot split are one-line errors.
TEST(PlanTrainer, UlyssesTwoRanksMatchesTrainsPrintedPlanAndTheRingsLosses) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  for (const char* prec : {"f32", "bf16"}) {
    const std::string p = prec;
    const std::string train = "train --model tiny-moe --steps 2 --seq-len 90 --cp 2 --schedules all --eval-every 0 "
                              "--json --precision " + p;
    CliRun plan = run_cli("plan --model tiny-moe --devices 2 --ep 2 --cp 2 --vocab-group 2 --context 90 --schedules all "
                          "--trainer-defaults --context-attention ulysses --json --precision " + p);
    CliRun ulysses = run_mpi(train + " --context-attention ulysses", 2, 300);
    CliRun ring = run_mpi(train, 2, 300);
    expect_same_numbers(plan, ulysses, "2 ranks, cp 2, Ulysses, " + p);
    ASSERT_EQ(ring.code, 0) << ring.err;
    const nlohmann::json u = last_json_line(ulysses.out), r = last_json_line(ring.out);
    EXPECT_EQ(u["context_attention"], "ulysses");
    EXPECT_EQ(r["context_attention"], "ring");
    for (const auto& [name, row] : u["peaks"].items()) {
      if (name != "dispatch" && name != "total") {
        EXPECT_EQ(row["planned_bytes"], row["measured_bytes"]) << name;
      }
    }
    const double tol = p == "f32" ? 1e-6 : 1e-3;
    for (const char* loss : {"first_loss", "final_loss"})
      EXPECT_NEAR(u[loss].get<double>(), r[loss].get<double>(), tol * r[loss].get<double>()) << loss << " " << p;
    EXPECT_GT(u["cp_ring_bytes_per_step"].get<std::int64_t>(), 0) << "Ulysses' all-to-alls are counted";
  }
  peakbound::testing::expect_one_line_error(run_cli("train --context-attention heads"), "--context-attention");
  peakbound::testing::expect_one_line_error(
      run_cli("plan --model tiny-moe --devices 3 --ep 1 --cp 3 --vocab-group 3 --context 96 --context-attention ulysses"),
      "cp must divide the 2 KV heads");
}

// A Hugging Face config in bf16: plan --precision bf16 is train --precision bf16's own plan.
TEST(PlanTrainer, HuggingFaceConfigInBf16MatchesTrainsPrintedPlan) {
  const std::string fixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/mixtral";
  CliRun plan = run_cli("plan --model " + fixture + " --devices 1 --context 64 --precision bf16 --trainer-defaults --json");
  CliRun train = run_cli("train --model " + fixture + " --steps 1 --seq-len 64 --precision bf16 --eval-every 0 --json", 300);
  expect_same_numbers(plan, train, "mixtral fixture, bf16");
}

// plan's default (bf16 parameters and activations, fp32 gradients and state) is a run the
// trainer executes: its footprint, not an estimate. bf16 gradients stay an estimate and say
// why; --trainer-defaults without --precision takes train's default precision.
TEST(PlanTrainer, Bf16PlanIsTheTrainersFootprintBf16GradientsAreAnEstimate) {
  CliRun r = run_cli("plan --model tiny-moe --devices 1 --context 96 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["source"]["scheduled"], "trainer_footprint") << r.out;
  CliRun b = run_cli("plan --model tiny-moe --devices 1 --context 96 --precision bf16 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out)["components"], nlohmann::json::parse(r.out)["components"]);
  r = run_cli("plan --model tiny-moe --devices 1 --context 96 --grad-dtype bf16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out);
  EXPECT_EQ(p["source"]["scheduled"], "estimate");
  EXPECT_NE(p["estimate_reason"].get<std::string>().find("fp32"), std::string::npos) << p["estimate_reason"];
  r = run_cli("plan --model tiny-moe --devices 1 --context 96 --trainer-defaults --json");
  CliRun f = run_cli("plan --model tiny-moe --devices 1 --context 96 --trainer-defaults --precision bf16 --json");
  CliRun g = run_cli("plan --model tiny-moe --devices 1 --context 96 --trainer-defaults --precision f32 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(f.code, 0) << f.err;
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(r.out, f.out);  // train's default precision is bf16
  EXPECT_NE(r.out, g.out);
  r = run_cli("plan --model tiny-moe --devices 1 --context 96 --trainer-defaults");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("source       the trainer's footprint"), std::string::npos) << r.out;
}

}  // namespace PB_TEST_FILE
}  // namespace
