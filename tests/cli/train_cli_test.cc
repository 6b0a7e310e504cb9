// `peakbound train` and `peakbound eval` end to end through the binary: a short run
// prints the plan, progress, the planned-vs-measured table and a JSON summary; a run
// starts from a Hugging Face directory's weights (that it loads and trains is checked
// here; the exactness of that path is tests/train/hf_reference_mpi_test.cc); metrics
// are JSONL; a budget the plan does not fit is refused before step 1.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/model/model_flops.h"
#include "peakbound/model/presets.h"
#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::last_json_line;
using peakbound::testing::CliRun;
using peakbound::testing::run_cli;

const std::string kFixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";

TEST(CliTrain, ShortRunPrintsPlanProgressAndThePeakTable) {
  const std::string metrics = ::testing::TempDir() + "/train_metrics.jsonl";
  CliRun r = run_cli("train --steps 3 --seq-len 32 --metrics " + metrics + " --json", 300);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("plan (per device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("planned"), std::string::npos) << r.out;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["schedules"], "all");
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  EXPECT_GT(j["peaks"]["total"]["measured_bytes"].get<double>(), 0);
  // The model's FLOPs a token (model/model_flops.h: tiny-moe at 32 tokens, the head's for
  // the scored share of them: the copy task scores its second segment) times the rate;
  // no MFU without --gemm-peak.
  const peakbound::ModelConfig tiny = peakbound::preset_config("tiny-moe");
  const double scored = j["scored_fraction"].get<double>();
  EXPECT_GT(scored, 0.0);
  EXPECT_LT(scored, 1.0);
  EXPECT_DOUBLE_EQ(j["model_flops_per_token"].get<double>(),
                   peakbound::model_flops_per_token(tiny, 32).per_token(scored));
  EXPECT_NEAR(j["achieved_flops_per_second"].get<double>(),
              j["model_flops_per_token"].get<double>() * j["tokens_per_second"].get<double>(),
              1e-9 * j["achieved_flops_per_second"].get<double>());
  EXPECT_FALSE(j.contains("mfu"));
  EXPECT_NE(r.out.find("FLOP/token"), std::string::npos) << r.out;
  std::ifstream m(metrics);
  std::string line;
  int lines = 0;
  double scored_tokens = 0;
  while (std::getline(m, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row["step"], ++lines);
    EXPECT_TRUE(row.contains("loss"));
    scored_tokens += row["scored_tokens"].get<double>();
  }
  EXPECT_EQ(lines, 3);
  EXPECT_DOUBLE_EQ(scored, scored_tokens / (3.0 * j["inputs_per_step"].get<double>()));
  std::remove(metrics.c_str());
}

// --precision bf16 trains (bf16 activations and compute parameters, fp32 master): its
// JSON says so, the loss is finite and falls, and the plan is what the run measured, per
// component but the routing-bound dispatch (measured at most planned). The same run in f32
// says f32 and starts from the same initial loss within bf16 rounding (1e-2 relative:
// each stored activation rounds by up to 2^-9 and a step chains a few dozen roundings).
TEST(CliTrain, Bf16RunSaysSoAndMeasuresItsPlan) {
  const CliRun b = run_cli("train --steps 4 --seq-len 32 --precision bf16 --json", 300);
  ASSERT_EQ(b.code, 0) << b.err << b.out;
  EXPECT_NE(b.out.find("precision bf16"), std::string::npos) << b.out;
  const nlohmann::json j = last_json_line(b.out);
  EXPECT_EQ(j["precision"], "bf16");
  for (const auto& [name, row] : j["peaks"].items()) {
    if (name == "total") continue;
    if (name == "dispatch") EXPECT_LE(row["measured_bytes"].get<std::int64_t>(), row["planned_bytes"].get<std::int64_t>());
    else EXPECT_EQ(row["planned_bytes"].get<std::int64_t>(), row["measured_bytes"].get<std::int64_t>()) << name;
  }
  const CliRun f = run_cli("train --steps 4 --seq-len 32 --precision f32 --json", 300);
  ASSERT_EQ(f.code, 0) << f.err << f.out;
  const nlohmann::json k = last_json_line(f.out);
  EXPECT_EQ(k["precision"], "f32");
  const double b0 = j["first_loss"].get<double>(), f0 = k["first_loss"].get<double>();
  EXPECT_NEAR(b0, f0, 1e-2 * f0);
  EXPECT_NE(b0, f0);  // the bf16 run is not the f32 run
  EXPECT_LT(j["final_loss"].get<double>(), b0);
  // bf16 parameters and activations: the planned params and layer bytes are below f32's.
  EXPECT_LT(j["peaks"]["params"]["planned_bytes"].get<std::int64_t>(), k["peaks"]["params"]["planned_bytes"].get<std::int64_t>());
  EXPECT_LT(j["peaks"]["layer"]["planned_bytes"].get<std::int64_t>(), k["peaks"]["layer"]["planned_bytes"].get<std::int64_t>());
}

// Every component of a run's JSON planned == measured (the dispatch: at most the planned,
// which reserves for the worst routing).
void expect_planned_is_measured(const nlohmann::json& run) {
  for (const auto& [name, row] : run["peaks"].items()) {
    if (name == "total") continue;
    if (name == "dispatch") EXPECT_LE(row["measured_bytes"].get<std::int64_t>(), row["planned_bytes"].get<std::int64_t>());
    else EXPECT_EQ(row["planned_bytes"].get<std::int64_t>(), row["measured_bytes"].get<std::int64_t>()) << name;
  }
}

// `args` on `ranks` processes (one: the binary itself; more: under mpirun).
CliRun run_ranks(const std::string& args, int ranks) {
  return ranks == 1 ? run_cli(args, 300) : peakbound::testing::run_mpi(args, ranks, 300);
}

// The last JSON lines of `base` and of `base FLAGS` (each must exit 0; nulls if not).
std::pair<nlohmann::json, nlohmann::json> run_two(const std::string& first, const std::string& second, int ranks = 1) {
  const CliRun a = run_ranks(first, ranks), b = run_ranks(second, ranks);
  EXPECT_EQ(a.code, 0) << a.err << a.out;
  EXPECT_EQ(b.code, 0) << b.err << b.out;
  if (a.code != 0 || b.code != 0) return {};
  return {last_json_line(a.out), last_json_line(b.out)};
}

std::pair<nlohmann::json, nlohmann::json> run_both(const std::string& base, const std::string& flags) {
  return run_two(base, base + " " + flags);
}

// `plan --trainer-defaults FLAGS` for the tiny-moe run of 32 tokens on one rank plans the
// peak that run (its JSON) planned.
void expect_plan_is_the_runs(const std::string& flags, const nlohmann::json& run) {
  const CliRun p = run_cli("plan --model tiny-moe --devices 1 --context 32 --trainer-defaults " + flags + " --json");
  ASSERT_EQ(p.code, 0) << p.err << p.out;
  EXPECT_EQ(nlohmann::json::parse(p.out)["peak_bytes"]["scheduled"], run["peaks"]["total"]["planned_bytes"]);
}

// Something kept for the backward instead of computed again (`key`: the JSON's switch):
// `plain` without it and `kept` with it say so, the same losses bitwise, the kept run's
// plan equals what it measured, and `component`'s planned peak grows by the kept bytes.
void expect_kept_changes_no_bit(const nlohmann::json& plain, const nlohmann::json& kept, const std::string& key,
                                const std::string& component) {
  EXPECT_EQ(plain[key], false);
  EXPECT_EQ(kept[key], true);
  EXPECT_EQ(plain["first_loss"].dump(), kept["first_loss"].dump());
  EXPECT_EQ(plain["final_loss"].dump(), kept["final_loss"].dump());
  expect_planned_is_measured(kept);
  EXPECT_GT(kept["peaks"][component]["planned_bytes"].get<std::int64_t>(),
            plain["peaks"][component]["planned_bytes"].get<std::int64_t>());
}

// --keep-attention: the same losses bitwise (the backward takes the forward's attention
// output instead of recomputing it), the JSON says so, the plan still equals what the run
// measured, and the attention's planned peak grows by the kept bytes.
TEST(CliTrain, KeepAttentionSameLossesAndItsPlanMeasured) {
  const std::string base = "train --steps 3 --seq-len 32 --eval-every 0 --json";
  const auto [a, b] = run_two(base + " --keep-attention=false", base + " --keep-attention");
  ASSERT_FALSE(a.is_null());
  expect_kept_changes_no_bit(a, b, "keep_attention", "attention");
  // `plan --keep-attention` for the same run plans the same peak.
  expect_plan_is_the_runs("--keep-attention", b);
}

// A choice the budget makes where its flag is not given (`key`: the run JSON's and the plan's
// knob): `base` with room takes it (the plan of `with`, the choice forced), and at a budget
// of `without`'s plan (the choice refused) it does not: that plan made again, planned ==
// measured, `line` printed, the same `loss` (a JSON key) as with room; `plan
// --trainer-defaults PLAN_FLAGS` at `ranks` devices and 512 tokens plans the same at both budgets.
// `room`: the flags of the roomy run and its plan (none: --device-memory auto, and the plan
// at train's auto).
void expect_the_budgets_choice(const std::string& base, const nlohmann::json& with, const nlohmann::json& without,
                               const std::string& key, const std::string& line, const std::string& loss,
                               const std::string& plan_flags, int ranks = 1, const std::string& room = "") {
  const auto planned = [](const nlohmann::json& j) { return j["peaks"]["total"]["planned_bytes"].get<std::int64_t>(); };
  ASSERT_GT(planned(with), planned(without));
  const std::string tight = " --device-memory " + std::to_string(planned(without));
  const CliRun roomy = run_ranks(base + room, ranks), short_of_it = run_ranks(base + tight, ranks);
  ASSERT_EQ(roomy.code, 0) << roomy.err << roomy.out;
  ASSERT_EQ(short_of_it.code, 0) << short_of_it.err << short_of_it.out;
  const nlohmann::json r = last_json_line(roomy.out), t = last_json_line(short_of_it.out);
  EXPECT_EQ(r[key], with[key]);
  EXPECT_EQ(planned(r), planned(with));
  EXPECT_EQ(t[key], without[key]);
  EXPECT_EQ(planned(t), planned(without));
  expect_planned_is_measured(t);
  EXPECT_NE(short_of_it.out.find(line), std::string::npos) << short_of_it.out;
  EXPECT_EQ(r[loss].dump(), t[loss].dump());
  for (const auto& [budget, want] : {std::pair{room, with}, std::pair{tight, without}}) {
    const CliRun p =
        run_cli("plan --model tiny-moe --devices " + std::to_string(ranks) + " --context 512 --trainer-defaults --json " +
                plan_flags + budget);
    ASSERT_EQ(p.code, 0) << p.err << p.out;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["peak_bytes"]["scheduled"], planned(want)) << budget;
    EXPECT_EQ(j["knobs"][key], want[key]) << budget;
  }
}

// --keep-attention not given is the budget's choice: kept where the plan fits with it (the
// same plan as --keep-attention), recomputed where only the plan without it fits (the plan
// made again, and a line says why), and `plan --trainer-defaults` chooses the same at the
// same budget. At 512 tokens the kept attention raises the step's peak.
TEST(CliTrain, KeepAttentionByTheBudget) {
  // The embedding fixed (its own choice by the budget comes first: EmbeddingByTheBudget).
  const std::string base = "train --steps 1 --seq-len 512 --eval-every 0 --embedding fsdp --json";
  const auto [plain, kept] = run_both(base + " --keep-attention=false", "--keep-attention");
  ASSERT_FALSE(plain.is_null());
  expect_the_budgets_choice(base, kept, plain, "keep_attention", "recomputes each layer's attention", "final_loss",
                            "--embedding fsdp");
  // A group's recomputation runs its attention: no keeping by the budget there.
  const CliRun grouped = run_cli(base + " --checkpoint-group 2", 300);
  ASSERT_EQ(grouped.code, 0) << grouped.err << grouped.out;
  EXPECT_EQ(last_json_line(grouped.out)["keep_attention"], false);
}

// Something the budget keeps for the backward on 2 ranks at 512 tokens (`flag` train's
// switch, `key` the JSON's, `component` where it lives; `fixed` pins the other choices):
// --flag changes no loss bit and grows the component's planned peak, planned == measured;
// not given, the budget's choice (expect_the_budgets_choice, with 1 GiB as the room);
// with --device-memory auto, which names no memory to spend, kept only where it leaves the
// plan's peak where it is (not here: the peak rises), so the plan without it and its loss.
void expect_kept_by_the_budget(const std::string& fixed, const std::string& flag, const std::string& key,
                               const std::string& component, const std::string& line) {
  const std::string base = "train --steps 2 --seq-len 512 --eval-every 0 --json " + fixed;
  const auto [plain, kept] = run_two(base + " " + flag + "=false", base + " " + flag, 2);
  ASSERT_FALSE(plain.is_null());
  expect_kept_changes_no_bit(plain, kept, key, component);
  expect_the_budgets_choice(base, kept, plain, key, line, "final_loss", fixed, 2, " --device-memory 1GiB");
  const CliRun automatic = run_ranks(base, 2);
  ASSERT_EQ(automatic.code, 0) << automatic.err << automatic.out;
  const nlohmann::json a = last_json_line(automatic.out);
  EXPECT_EQ(a[key], false);
  EXPECT_EQ(a["peaks"]["total"]["planned_bytes"], plain["peaks"]["total"]["planned_bytes"]);
  EXPECT_EQ(a["final_loss"].dump(), plain["final_loss"].dump());
}

// --keep-logits (2 ranks: a vocabulary group of 2, Ring-DTP's ring, not the one-rank fused
// form): Ring-DTP's logits blocks kept from the loss's forward for the backward (which
// turns them into their gradients instead of computing them again), by the budget as above. The experts are pinned too (with room the budget keeps them, and drops them first).
TEST(CliTrain, KeepLogitsSameLossesAndByTheBudget) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  expect_kept_by_the_budget("--keep-attention=false --keep-experts=false --embedding fsdp", "--keep-logits",
                            "keep_logits", "vocab", "computes its logits again in the backward");
}

// --keep-experts: every MoE layer's experts' gate, up, act and out kept from its forward
// for its backward (which then runs no expert forward), the dispatch's planned peak grown
// by the kept rows, by the budget as above (dropped first where the plan does not fit).
TEST(CliTrain, KeepExpertsSameLossesAndByTheBudget) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  expect_kept_by_the_budget("--keep-attention=false --keep-logits=false --embedding fsdp", "--keep-experts",
                            "keep_experts", "dispatch", "the experts compute their forward again in the backward");
}

// --checkpoint-group: the same losses bitwise (a group's recomputation gives its layers'
// inputs bit for bit), the JSON says so, the plan equals what the run measured, the host
// holds fewer boundaries, and `plan --checkpoint-group` plans the same peak. Refused: 0,
// more than the layers, and with --keep-attention.
TEST(CliTrain, CheckpointGroupsSameLossesAndTheirPlanMeasured) {
  const auto [a, b] = run_both("train --steps 3 --seq-len 32 --eval-every 0 --json", "--checkpoint-group 2");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["checkpoint_group"], 1);
  EXPECT_EQ(b["checkpoint_group"], 2);
  EXPECT_EQ(a["first_loss"].dump(), b["first_loss"].dump());
  EXPECT_EQ(a["final_loss"].dump(), b["final_loss"].dump());
  expect_planned_is_measured(b);
  expect_plan_is_the_runs("--checkpoint-group 2", b);
  expect_one_line_error(run_cli("train --checkpoint-group 0"), "--checkpoint-group");
  expect_one_line_error(run_cli("train --model tiny-moe --checkpoint-group 99"), "--checkpoint-group");
  expect_one_line_error(run_cli("train --checkpoint-group 2 --keep-attention"), "--keep-attention");
}

// --embedding vocab: the first step's loss bitwise the FSDP embedding's (the same rows;
// later steps differ by the order of the embedding gradient's sums), planned == measured,
// and `plan --embedding vocab` plans the run's peak. A bad value is one line.
TEST(CliTrain, VocabEmbeddingSameFirstLossAndItsPlanMeasured) {
  const std::string base = "train --steps 2 --seq-len 32 --eval-every 0 --json --embedding ";
  const auto [a, b] = run_two(base + "fsdp", base + "vocab");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["embedding"], "fsdp");
  EXPECT_EQ(b["embedding"], "vocab");
  EXPECT_EQ(a["first_loss"].dump(), b["first_loss"].dump());
  EXPECT_NEAR(a["final_loss"].get<double>(), b["final_loss"].get<double>(), 1e-5 * a["final_loss"].get<double>());
  expect_planned_is_measured(b);
  expect_plan_is_the_runs("--embedding vocab", b);
  expect_one_line_error(run_cli("train --embedding rows"), "--embedding");
  expect_one_line_error(run_cli("plan --embedding rows"), "embedding");
}

// --embedding not given (auto) is the budget's choice: the vocabulary-parallel one where the
// plan fits with it (the plan of --embedding vocab), the FSDP unit where only the plan
// without it fits (the plan made again, a line says why; the same first loss: the same
// rows), and `plan --trainer-defaults` chooses the same at the same budget. On 2 ranks with
// a vocabulary group of one the head's store is replicated (not the optimizer's shard
// itself), and the embedding's rows in it with their exchange buffers raise the step's
// peak over the FSDP unit's; the baseline (--schedules none) keeps FSDP's embedding.
TEST(CliTrain, EmbeddingByTheBudget) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string base = "train --steps 1 --seq-len 512 --eval-every 0 --keep-attention=false --vocab-group 1 --json";
  const auto [fsdp, v] = run_two(base + " --embedding fsdp", base + " --embedding vocab", 2);
  ASSERT_FALSE(fsdp.is_null());
  expect_the_budgets_choice(base, v, fsdp, "embedding", "the embedding is an FSDP unit (--embedding auto)",
                            "first_loss", "--keep-attention=false --vocab-group 1", 2);
  const CliRun baseline = run_cli("train --steps 1 --seq-len 32 --eval-every 0 --schedules none --json", 300);
  ASSERT_EQ(baseline.code, 0) << baseline.err << baseline.out;
  EXPECT_EQ(last_json_line(baseline.out)["embedding"], "fsdp");
}

TEST(CliTrain, PrecisionErrorsAreOneLineNamingTheFlag) {
  for (const char* cmd : {"train --precision f16", "eval --data x.bin --precision fp8",
                          "bench reach --precision half", "plan --precision f64"})
    peakbound::testing::expect_one_line_error(run_cli(cmd), "--precision");
  // plan: --param-dtype is the older spelling of the same dtype; a contradiction is refused.
  peakbound::testing::expect_one_line_error(run_cli("plan --model tiny-moe --precision f32 --param-dtype bf16"),
                                            "--param-dtype bf16");
  EXPECT_EQ(run_cli("plan --model tiny-moe --precision bf16 --param-dtype bfloat16").code, 0);
}

// A config file gives the flags; the command line overrides it.
TEST(CliTrain, TakesAConfigFileThatFlagsOverride) {
  const std::string toml = ::testing::TempDir() + "/train.toml";
  {
    std::ofstream f(toml);
    f << "steps = 5\nseq-len = 32\nschedules = \"none\"\njson = true\n";
  }
  CliRun r = run_cli("train --config " + toml + " --steps 2", 120);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(j["steps"], 2);             // the flag
  EXPECT_EQ(j["schedules"], "none");    // the file
  std::remove(toml.c_str());
}

TEST(CliTrain, StartsFromAHuggingFaceDirectory) {
  CliRun r = run_cli("train --model " + kFixture + " --steps 2 --seq-len 16 --symbols 8 --schedules none --json", 120);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_EQ(last_json_line(r.out)["model"], "qwen3_moe");
}

// A token file (llm.c's format): training windows from its first part, the held-out
// loss from the last --eval-fraction.
TEST(CliTrain, TrainsOnATokenFile) {
  const std::string path = ::testing::TempDir() + "/train_tokens.bin";
  {
    std::ofstream f(path, std::ios::binary);
    const int n = 4000;
    int header[256] = {20240520, 1, n};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < n; ++i) {
      const unsigned short t = static_cast<unsigned short>((i * 7919) % 16384);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  CliRun r = run_cli("train --data " + path + " --steps 2 --seq-len 32 --eval-fraction 0.1 --json", 120);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("token file"), std::string::npos) << r.out;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_TRUE(j.contains("eval_loss"));
  EXPECT_FALSE(j.contains("blind_loss"));  // unknown for a corpus
  // A token outside the model's vocabulary is refused, naming the file.
  CliRun bad = run_cli("train --model " + kFixture + " --data " + path + " --steps 1 --seq-len 32", 60);
  peakbound::testing::expect_one_line_error(bad, path);
  std::remove(path.c_str());
}

TEST(CliTrain, ABudgetThePlanDoesNotFitIsRefusedBeforeStepOne) {
  CliRun r = run_cli("train --steps 1 --seq-len 32 --device-memory 16MiB", 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("budget"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 1/1"), std::string::npos) << r.out;
}

TEST(CliTrain, RunsUnderMpiWithEveryScheduleSet) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  for (const char* sched : {"all", "none"}) {
    CliRun r = peakbound::testing::run_mpi(
        std::string("train --steps 2 --seq-len 32 --json --schedules ") + sched, 2, 300);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_EQ(last_json_line(r.out)["ranks"], 2) << r.out;
  }
}

// --cp splits every sequence over consecutive ranks: 2 ranks at --cp 2 with 2 sequences
// a group train on the global batch of 2 ranks at --cp 1 with 1 each, the same losses to
// fp32 rounding (in f32; every schedule on; 33 tokens, which 4 chunks do not divide).
TEST(CliTrain, ContextParallelTrainsAsCp1) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  auto losses = [](const std::string& layout) {
    const std::string metrics = ::testing::TempDir() + "/cp.jsonl";
    CliRun r = peakbound::testing::run_mpi(
        "train --precision f32 --steps 3 --seq-len 33 --eval-every 0 --json --metrics " + metrics + " " + layout, 2,
        300);
    EXPECT_EQ(r.code, 0) << r.err << r.out;
    std::ifstream m(metrics);
    std::vector<double> out;
    std::string line;
    while (std::getline(m, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    std::remove(metrics.c_str());
    return out;
  };
  const std::vector<double> a = losses("--cp 1 --batch 1"), b = losses("--cp 2 --batch 2");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
  // A size that does not divide the ranks is one line naming the flag.
  peakbound::testing::expect_one_line_error(run_cli("train --steps 1 --cp 2", 60), "--cp 2");
}

// tiny-deepseek at --cp 2: the ring carries MLA's latent and rope key (the default) or every
// head's K and V (--cp-ring kv); the losses agree to fp32 rounding, and the bytes the rings
// sent per step (cp_ring_bytes_per_step, counted as the rings post their sends) are in the
// ratio of the per-token widths, (latent + rope) / (heads x (qk + v)); none at --cp 1.
TEST(CliTrain, DeepSeekRingCarriesTheLatent) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  auto run = [](const std::string& extra) {
    CliRun r = peakbound::testing::run_mpi(
        "train --model tiny-deepseek --precision f32 --steps 2 --seq-len 33 --eval-every 0 --json " + extra, 2, 300);
    EXPECT_EQ(r.code, 0) << r.err << r.out;
    return last_json_line(r.out);
  };
  const nlohmann::json latent = run("--cp 2"), kv = run("--cp 2 --cp-ring kv"), cp1 = run("--cp 1 --batch 1");
  const peakbound::ModelConfig c = peakbound::preset_config("tiny-deepseek");
  const auto lat_bytes = latent["cp_ring_bytes_per_step"].get<std::int64_t>();
  const auto kv_bytes = kv["cp_ring_bytes_per_step"].get<std::int64_t>();
  EXPECT_GT(lat_bytes, 0);
  EXPECT_EQ(lat_bytes * c.num_heads * (c.qk_head_dim() + c.v_head_dim), kv_bytes * (c.kv_lora_rank + c.qk_rope_head_dim));
  EXPECT_EQ(cp1["cp_ring_bytes_per_step"].get<std::int64_t>(), 0);
  EXPECT_NEAR(latent["final_loss"].get<double>(), kv["final_loss"].get<double>(), 1e-5 * kv["final_loss"].get<double>());
  EXPECT_LT(latent["peaks"]["attention"]["measured_bytes"].get<std::int64_t>(),
            kv["peaks"]["attention"]["measured_bytes"].get<std::int64_t>());
  peakbound::testing::expect_one_line_error(run_cli("train --steps 1 --cp-ring heads", 60), "--cp-ring");
}

// --gemm-peak: the summary's MFU is the achieved model FLOP/s over the peak given.
TEST(CliTrain, MfuIsTheAchievedRateOverTheGivenPeak) {
  CliRun r = run_cli("train --steps 2 --seq-len 32 --gemm-peak 1e11 --json", 300);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_NEAR(j["mfu"].get<double>(), j["achieved_flops_per_second"].get<double>() / 1e11, 1e-12);
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
  EXPECT_EQ(j["gemm_peak_flops_per_second"].get<double>(), 1e11);
  peakbound::testing::expect_one_line_error(run_cli("train --steps 1 --gemm-peak -5", 60), "--gemm-peak");
  // Measured instead: the peak is this machine's (positive), the MFU the rate over it.
  CliRun m = run_cli("train --steps 2 --seq-len 32 --measure-gemm-peak --json", 300);
  ASSERT_EQ(m.code, 0) << m.err << m.out;
  const nlohmann::json jm = last_json_line(m.out);
  const double peak = jm["gemm_peak_flops_per_second"].get<double>();
  EXPECT_GT(peak, 0.0);
  EXPECT_NEAR(jm["mfu"].get<double>(), jm["achieved_flops_per_second"].get<double>() / peak, 1e-12);
  peakbound::testing::expect_one_line_error(run_cli("train --steps 1 --gemm-peak 1e9 --measure-gemm-peak", 60),
                                            "--measure-gemm-peak");
}

// phase_seconds: the step's time split by phase (core/phase_clock.h). On one rank the
// phases sum to the steps' wall time (other is the remainder, never negative); each phase
// the model runs took time, and the summary prints the split.
TEST(CliTrain, PhaseSecondsSplitTheStepTime) {
  CliRun r = run_cli("train --steps 3 --seq-len 32 --json", 300);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = last_json_line(r.out);
  ASSERT_TRUE(j.contains("phase_seconds")) << j.dump();
  const nlohmann::json& ph = j["phase_seconds"];
  double sum = 0, steps = 0;
  for (const char* k : {"attention", "experts", "dispatch", "vocabulary", "fsdp", "optimizer", "other"}) {
    ASSERT_TRUE(ph.contains(k)) << k;
    EXPECT_GE(ph[k].get<double>(), 0.0) << k;
    sum += ph[k].get<double>();
  }
  EXPECT_EQ(ph.size(), 7u);
  for (const char* k : {"attention", "experts", "vocabulary", "optimizer"}) EXPECT_GT(ph[k].get<double>(), 0.0) << k;
  for (double s : j["step_seconds"].get<std::vector<double>>()) steps += s;
  EXPECT_NEAR(sum, steps, 1e-9 * steps + 1e-12);
  EXPECT_NE(r.out.find("step time (mean over ranks): attention"), std::string::npos) << r.out;
  // One rank has no peer: its communicator makes no calls, so nothing is exposed.
  ASSERT_TRUE(j.contains("communication_seconds")) << j.dump();
  EXPECT_EQ(j["communication_seconds"].get<double>(), 0.0);
  if (peakbound::testing::have_mpirun()) {  // every rank runs the dispatch's exchange and FSDP's collectives
    CliRun m = peakbound::testing::run_mpi("train --steps 2 --seq-len 32 --json", 2, 300);
    ASSERT_EQ(m.code, 0) << m.err << m.out;
    const nlohmann::json jm = last_json_line(m.out);
    for (const char* k : {"dispatch", "fsdp"}) EXPECT_GT(jm["phase_seconds"][k].get<double>(), 0.0) << k;
    // Exposed communication is part of the steps' time (the mean rank's), never more.
    double msteps = 0;
    for (const auto& [k, v] : jm["phase_seconds"].items()) msteps += v.get<double>();
    const double comm = jm["communication_seconds"].get<double>();
    EXPECT_GT(comm, 0.0);
    EXPECT_LE(comm, msteps * (1 + 1e-9));
    EXPECT_NE(m.out.find("exposed communication"), std::string::npos) << m.out;
  }
}

// --sync-phases: every phase boundary waits for the device. On the CPU device (whose
// compute is inline) it changes no bit of the run, and says that its phases were taken so.
TEST(CliTrain, SyncPhasesReportsSynchronizedPhasesAndTheSameLosses) {
  CliRun a = run_cli("train --steps 2 --seq-len 32 --json", 300);
  CliRun b = run_cli("train --steps 2 --seq-len 32 --json --sync-phases", 300);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const nlohmann::json ja = last_json_line(a.out), jb = last_json_line(b.out);
  EXPECT_EQ(ja["final_loss"].dump(), jb["final_loss"].dump());
  EXPECT_FALSE(ja["phases_synchronized"].get<bool>());
  EXPECT_TRUE(jb["phases_synchronized"].get<bool>());
  ASSERT_TRUE(jb.contains("phase_seconds")) << jb.dump();
  EXPECT_GT(jb["phase_seconds"]["attention"].get<double>(), 0.0);
  EXPECT_NE(b.out.find("the device synchronized at every phase boundary"), std::string::npos) << b.out;
}

// A fixed seed gives bitwise the same run: every step's loss and the final summary.
TEST(CliTrain, AFixedSeedRepeatsBitwise) {
  auto losses = [](const std::string& seed, int ranks) {
    const std::string metrics = ::testing::TempDir() + "/repeat_" + std::to_string(ranks) + ".jsonl";
    const std::string args = "train --steps 4 --seq-len 32 --seed " + seed + " --metrics " + metrics;
    CliRun r = ranks == 1 ? run_cli(args, 300) : peakbound::testing::run_mpi(args, ranks, 300);
    EXPECT_EQ(r.code, 0) << r.err;
    std::ifstream m(metrics);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(m, line)) out.push_back(nlohmann::json::parse(line)["loss"].dump());
    std::remove(metrics.c_str());
    return out;
  };
  const std::vector<std::string> a = losses("5", 1), b = losses("5", 1);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, losses("6", 1));  // and the seed matters
  if (peakbound::testing::have_mpirun()) {
    const std::vector<std::string> c = losses("5", 2), d = losses("5", 2);
    ASSERT_EQ(c.size(), 4u);
    EXPECT_EQ(c, d);
  }
}

TEST(CliEval, PrintsLossAndTokensAsJson) {
  // A token file of 4 windows of 16 (+1) tokens, in llm.c's format.
  const std::string path = ::testing::TempDir() + "/eval_tokens.bin";
  {
    std::ofstream f(path, std::ios::binary);
    int header[256] = {20240520, 1, 65};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < 65; ++i) {
      const unsigned short t = static_cast<unsigned short>((i * 37) % 256);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  CliRun r = run_cli("eval --model " + kFixture + " --data " + path + " --context 16 --precision f32 --json", 120);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"], 64);
  EXPECT_EQ(j["precision"], "f32");
  EXPECT_GT(j["loss"].get<double>(), 0);
  // The bf16 model (weights to_bf16 of the checkpoint's, fp32 statistics and sums): the
  // same tokens, the loss within bf16 rounding (1e-2 relative), not the f32 bits. bf16 is
  // the default.
  CliRun b = run_cli("eval --model " + kFixture + " --data " + path + " --context 16 --json", 120);
  ASSERT_EQ(b.code, 0) << b.err;
  const nlohmann::json bj = nlohmann::json::parse(b.out);
  EXPECT_EQ(bj["precision"], "bf16");
  EXPECT_EQ(bj["tokens"], 64);
  EXPECT_NEAR(bj["loss"].get<double>(), j["loss"].get<double>(), 1e-2 * j["loss"].get<double>());
  EXPECT_NE(bj["loss"].get<double>(), j["loss"].get<double>());
  if (peakbound::testing::have_mpirun()) {
    // Each window split over 2 ranks (--cp 2): the same loss over the same tokens.
    CliRun cp = peakbound::testing::run_mpi(
        "eval --model " + kFixture + " --data " + path + " --context 16 --cp 2 --precision f32 --json", 2, 120);
    ASSERT_EQ(cp.code, 0) << cp.err;
    const nlohmann::json k = last_json_line(cp.out);
    EXPECT_EQ(k["tokens"], 64);
    EXPECT_NEAR(k["loss"].get<double>(), j["loss"].get<double>(), 1e-5 * j["loss"].get<double>());
  }
  CliRun bad = run_cli("eval --model " + kFixture + " --data " + path + " --context 16 --windows 5", 60);
  peakbound::testing::expect_one_line_error(bad, "--windows 5");
  std::remove(path.c_str());
}

}  // namespace PB_TEST_FILE
}  // namespace
