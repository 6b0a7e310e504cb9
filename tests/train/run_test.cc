// The run object (train/run.h): its settings' errors name the setting, and a run driven
// through it is `peakbound train`'s run, bit for bit (the CLI is a thin layer over it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/train/copy_task.h"
#include "peakbound/train/run.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/run_resume.h"
#include "peakbound/train/sequence_source.h"
#include "peakbound/train/train_footprint.h"
#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string error_of(const RunSettings& s, SettingSpelling spell = field_spelling) {
  try {
    s.validate(1, spell);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(RunSettings, FlagSpellingIsTheFieldWithDashes) {
  EXPECT_EQ(field_spelling("device_memory"), "device_memory");
  EXPECT_EQ(flag_spelling("device_memory"), "--device-memory");
  EXPECT_EQ(flag_spelling("seq_len"), "--seq-len");
}

TEST(RunSettings, ErrorsNameTheSettingAsTheCallerSpellsIt) {
  RunSettings s;
  s.seq_len = 4;
  EXPECT_EQ(error_of(s), "seq_len must be at least 8, got 4");
  EXPECT_EQ(error_of(s, flag_spelling), "--seq-len must be at least 8, got 4");
  s = RunSettings{};
  s.on_nonfinite = "ignore";
  EXPECT_EQ(error_of(s), "on_nonfinite must be stop or skip, got 'ignore'");
  s = RunSettings{};
  s.data = "tokens.bin";
  s.task = "kv";
  EXPECT_NE(error_of(s).find("task kv and data tokens.bin"), std::string::npos) << error_of(s);
  s = RunSettings{};
  s.task = "sort";
  EXPECT_EQ(error_of(s), "task must be copy, kv or random, got 'sort'");
  s = RunSettings{};
  s.save_every = 5;
  EXPECT_EQ(error_of(s, flag_spelling), "--save-every needs --save-dir");
  s = RunSettings{};
  s.min_lr = 1.0;
  EXPECT_NE(error_of(s).find("min_lr 1.000000 exceeds lr"), std::string::npos) << error_of(s);
  s = RunSettings{};
  s.plan_skew = 0.5;
  EXPECT_EQ(error_of(s), "plan_skew must be 0 (worst case) or >= 1");
  s = RunSettings{};
  s.device_memory = "lots";
  EXPECT_NE(error_of(s).find("device_memory"), std::string::npos) << error_of(s);
  EXPECT_EQ(error_of(RunSettings{}), "");  // the defaults are a run
}

// The same settings through the CLI (a process of its own) and through Run here: every
// step's cross-entropy, the held-out loss and every measured peak identical.
TEST(Run, StepsAreTheCliTrainsBitwise) {
  const std::string metrics = ::testing::TempDir() + "/run_test_cli.jsonl";
  std::remove(metrics.c_str());
  const testing::CliRun cli =
      testing::run_cli("train --steps 4 --seq-len 32 --eval-every 2 --schedules llep,sco --metrics " + metrics + " --json", 300);
  ASSERT_EQ(cli.code, 0) << cli.err << cli.out;
  const nlohmann::json cj = testing::last_json_line(cli.out);
  std::vector<double> cli_ce;
  std::ifstream m(metrics);
  for (std::string line; std::getline(m, line);) cli_ce.push_back(nlohmann::json::parse(line)["ce"].get<double>());
  ASSERT_EQ(cli_ce.size(), 4u);

  RunSettings s;
  s.steps = 4;
  s.seq_len = 32;
  s.eval_every = 2;
  s.schedules = ScheduleSet::parse("llep,sco");
  s.validate(1);
  std::string said;
  peakbound::Run run(s, [&](const std::string& t) { said += t; });
  std::vector<double> ce;
  while (!run.done()) {
    const RunStep r = run.step();
    ASSERT_EQ(r.stats.stopped, 0);
    ASSERT_EQ(r.stop_signal, 0);
    ce.push_back(r.stats.ce);
  }
  const RunSummary sum = run.finish();
  ASSERT_EQ(ce.size(), cli_ce.size());
  for (std::size_t i = 0; i < ce.size(); ++i) EXPECT_EQ(ce[i], cli_ce[i]) << "step " << i + 1;
  ASSERT_TRUE(sum.eval_loss.has_value());
  EXPECT_EQ(*sum.eval_loss, cj["eval_loss"].get<double>());
  EXPECT_EQ(sum.last_loss, cj["final_loss"].get<double>());
  const nlohmann::json j = sum.json();
  EXPECT_EQ(j["peaks"], cj["peaks"]);
  EXPECT_EQ(j["budget_bytes"], cj["budget_bytes"]);
  // What the Run says is what the CLI prints, less the progress lines and the JSON.
  EXPECT_NE(said.find("peakbound train: tiny-moe"), std::string::npos) << said;
  EXPECT_NE(cli.out.find(said.substr(0, said.find("data:"))), std::string::npos) << said;
  EXPECT_NE(cli.out.find(sum.text().substr(0, sum.text().find("\nloss"))), std::string::npos) << sum.text();
}

// The Run against the Trainer driven by hand on the same settings (the model, the task's
// sequences in order, AdamW with beta2 0.95 under the warm-up and cosine schedule, the
// offload-stream optimizer of the adam schedule): the same cross-entropy at every step.
TEST(Run, StepsAreTheTrainerDrivenDirectly) {
  RunSettings s;
  s.steps = 3;
  s.seq_len = 32;
  s.eval_batches = 0;
  s.validate(1);
  std::vector<double> ce;
  {
    peakbound::Run run(s);
    while (!run.done()) ce.push_back(run.step().stats.ce);
    EXPECT_THROW(run.step(), InvalidArgument);  // every step taken
  }
  const RunShape shape = resolve_run(s, 1);
  RunModel m(world_communicator(), "cpu", std::uint64_t{1} << 30, s.model, shape.config, shape.layout,
             shape.schedules, s.seed);
  auto source = copy_task_source(CopyTask{shape.config.vocab_size, s.seq_len, s.symbols, s.seed},
                                 shape.schedules.vocab.ignore_index);
  TrainerOptions o;
  o.optimizer = "offload_stream";
  o.optimizer_options.adam.lr = 2e-3f;
  o.optimizer_options.adam.weight_decay = 0.0f;
  o.optimizer_options.adam.max_grad_norm = 1.0f;
  o.optimizer_options.adam.beta2 = 0.95f;
  o.lr = LrSchedule{2e-3f, 2e-4f, 10, 3};
  Trainer trainer(*m.model, m.host, m.pool, o);
  std::vector<std::int32_t> ids(32), tgt(32);
  for (std::int64_t step = 1; step <= 3; ++step) {
    source->train(step - 1, ids.data(), tgt.data());
    const MicroBatch mb{ids.data(), tgt.data(), 1, 32};
    EXPECT_EQ(trainer.step({&mb, 1}).ce, ce[static_cast<std::size_t>(step - 1)]) << "step " << step;
  }
}

// SCO's ring by the budget (prefetch_depth -1): a device memory between the plan with two
// ring slots and with one gets one slot, said in the plan's lines and the summary, and the
// same losses bitwise as the two-slot run (only where the boundaries wait differs); the
// depth given explicitly is kept, and the plan over the budget refused.
TEST(Run, TheRingHoldsOneBoundaryWhenTwoDoNotFit) {
  RunSettings s;
  s.embedding = "fsdp";  // the budget's other choices fixed: only the ring's is tested here
  s.steps = 2;
  s.seq_len = 64;
  s.eval_batches = 0;
  s.validate(1);
  auto total = [&](std::int64_t depth) {
    RunShape shape = resolve_run(s, 1);
    shape.schedules.checkpoint.prefetch_depth = depth;
    return train_footprint(run_footprint_inputs(s, shape, 1, 0)).device_peak_total();
  };
  const std::uint64_t two = total(1), one = total(0);
  ASSERT_LT(one, two);
  std::vector<double> ce_two;
  {
    peakbound::Run run(s);
    while (!run.done()) ce_two.push_back(run.step().stats.ce);
  }
  s.device_memory = std::to_string((one + two) / 2);
  std::string text;
  std::vector<double> ce_one;
  {
    peakbound::Run run(s, [&](const std::string& t) { text += t; });
    while (!run.done()) ce_one.push_back(run.step().stats.ce);
    EXPECT_EQ(run.finish().run["prefetch_depth"], 0);
  }
  EXPECT_NE(text.find("SCO's ring holds one boundary"), std::string::npos) << text;
  EXPECT_EQ(ce_one, ce_two);
  s.prefetch_depth = 1;
  EXPECT_THROW(peakbound::Run{s}, AgreedError);
}

// A stop after a step: without a save folder nothing is saved (130); with one the last
// complete step is saved and a resume continues from it.
TEST(Run, StopAfterAStepSavesTheLastCompleteStep) {
  RunSettings s;
  s.steps = 5;
  s.seq_len = 16;
  s.eval_batches = 0;
  int calls = 0;
  {
    peakbound::Run run(s, {}, [&] { return std::int64_t{++calls >= 2 ? 15 : 0}; });
    RunStep r = run.step();
    while (r.stop_signal == 0 && r.stats.stopped == 0) r = run.step();
    EXPECT_EQ(run.stop(r), 130);
  }
  const std::string dir = ::testing::TempDir() + "/run_test_save";
  std::filesystem::remove_all(dir);
  s.save_dir = dir;
  s.validate(1);
  calls = 0;
  std::int64_t stopped_at = 0;
  {
    // The stop check runs between micro-batches and after each step: the fourth call
    // comes after step 1 at the earliest, so a complete step is there to save.
    peakbound::Run run(s, {}, [&] { return std::int64_t{++calls >= 4 ? 15 : 0}; });
    RunStep r = run.step();
    while (r.stop_signal == 0 && r.stats.stopped == 0) r = run.step();
    stopped_at = run.steps_done();
    EXPECT_EQ(run.stop(r), 0);
  }
  ASSERT_GT(stopped_at, 0);
  ASSERT_TRUE(has_checkpoint(dir));
  EXPECT_EQ(read_checkpoint_manifest(resolve_checkpoint(dir))["step"], stopped_at);
  s.resume = dir;
  s.validate(1);
  peakbound::Run resumed(s);
  EXPECT_EQ(resumed.steps_done(), stopped_at);
  while (!resumed.done()) resumed.step();
  EXPECT_EQ(resumed.finish().steps, 5 - stopped_at);
}

// The precision is the model's (ModelSchedules::precision, resolve_run) and the run record's.
TEST(RunSettings, PrecisionReachesTheModelAndThePlan) {
  RunSettings s;
  EXPECT_EQ(s.precision, Precision::bf16);  // the default
  EXPECT_EQ(resolve_run(s, 1).schedules.precision, Precision::bf16);
  EXPECT_EQ(run_footprint_inputs(s, resolve_run(s, 1), 1, 0).schedules.precision, Precision::bf16);
  s.precision = Precision::f32;
  const RunShape shape = resolve_run(s, 1);
  EXPECT_EQ(shape.schedules.precision, Precision::f32);
  EXPECT_EQ(run_footprint_inputs(s, shape, 1, 0).schedules.precision, Precision::f32);
  EXPECT_EQ(model_schedules(ScheduleSet::all(), Precision::bf16).precision, Precision::bf16);
  EXPECT_EQ(model_schedules(ScheduleSet::all()).precision, Precision::f32);
}

// A resume may change the precision (the master is fp32 either way): said, not refused; a
// checkpoint from before the record was an f32 run's.
TEST(RunResume, PrecisionMayChangeAndIsSaid) {
  const nlohmann::json model = {{"name", "m"}};
  const nlohmann::json f32 = {{"manifest", 1}, {"run", {{"precision", "f32"}, {"steps", 4}}}};
  const nlohmann::json old = {{"run", {{"steps", 4}}}};
  const nlohmann::json bf16_run = {{"precision", "bf16"}, {"steps", 4}, {"data", nullptr}};
  EXPECT_NE(check_resume(f32, bf16_run, model, 1).find("--precision bf16 (the checkpoint's run: f32)"), std::string::npos)
      << check_resume(f32, bf16_run, model, 1);
  EXPECT_NE(check_resume(old, bf16_run, model, 1).find("--precision bf16 (the checkpoint's run: f32)"), std::string::npos)
      << check_resume(old, bf16_run, model, 1);
  const nlohmann::json f32_run = {{"precision", "f32"}, {"steps", 4}, {"data", nullptr}};
  EXPECT_EQ(check_resume(f32, f32_run, model, 1).find("--precision"), std::string::npos);
  EXPECT_EQ(check_resume(old, f32_run, model, 1).find("--precision"), std::string::npos);
}

std::vector<float> master_of(peakbound::Run& run) {
  Trainer& t = run.trainer();
  std::vector<float> master(t.shard_elements()), m(master.size()), v(master.size());
  t.read_shard(master.data(), m.data(), v.data());
  return master;
}

std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return a.size() + b.size();
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// A bf16 run resumes bitwise: 6 steps straight against 3, a save, a fresh Run resumed
// from it and 3 more: every step's loss and the final fp32 master bit for bit (restore
// narrows the master with AdamW's rounding, so the compute copy is the same bf16). The
// checkpoint's run record says bf16.
TEST(Run, Bf16ResumeIsBitwise) {
  RunSettings s;
  s.steps = 6;
  s.seq_len = 16;
  s.eval_batches = 0;
  s.precision = Precision::bf16;
  s.validate(1);
  std::vector<double> straight, resumed;
  std::vector<float> straight_master;
  {
    peakbound::Run run(s);
    while (!run.done()) straight.push_back(run.step().stats.loss);
    straight_master = master_of(run);
  }
  const std::string dir = ::testing::TempDir() + "/run_test_bf16_resume";
  std::filesystem::remove_all(dir);
  s.save_dir = dir;
  s.validate(1);
  {
    peakbound::Run run(s);
    for (int k = 0; k < 3; ++k) resumed.push_back(run.step().stats.loss);
    run.save();
  }
  const nlohmann::json manifest = read_checkpoint_manifest(resolve_checkpoint(dir));
  EXPECT_EQ(manifest["step"], 3);
  EXPECT_EQ(manifest["run"]["precision"], "bf16");
  s.resume = dir;
  s.validate(1);
  std::vector<float> resumed_master;
  {
    peakbound::Run run(s);
    EXPECT_EQ(run.steps_done(), 3);
    while (!run.done()) resumed.push_back(run.step().stats.loss);
    resumed_master = master_of(run);
  }
  ASSERT_EQ(straight.size(), resumed.size());
  for (std::size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
  EXPECT_EQ(bits_differ(straight_master, resumed_master), 0u) << "of " << straight_master.size();
}

// An f32 checkpoint resumes under bf16: the resumed run's master is the checkpoint's bit
// for bit, the change is said, and its next steps' losses are the f32 run's within bf16
// rounding (2e-2 relative: the compute copy rounds each parameter by up to 2^-9 and the
// activations round too).
TEST(Run, F32CheckpointResumesUnderBf16) {
  RunSettings s;
  s.precision = Precision::f32;
  s.steps = 5;
  s.seq_len = 16;
  s.eval_batches = 0;
  const std::string dir = ::testing::TempDir() + "/run_test_f32_to_bf16";
  std::filesystem::remove_all(dir);
  s.save_dir = dir;
  s.validate(1);
  std::vector<float> saved_master;
  std::vector<double> f32_losses;
  {
    peakbound::Run run(s);
    for (int k = 0; k < 3; ++k) run.step();
    run.save();
    saved_master = master_of(run);
    while (!run.done()) f32_losses.push_back(run.step().stats.loss);
    run.finish();
  }
  const std::string step3 = (std::filesystem::path(dir) / "step-00000003").string();
  ASSERT_TRUE(std::filesystem::exists(step3)) << step3;
  s.resume = step3;
  s.precision = Precision::bf16;
  s.save_dir = "";
  s.validate(1);
  std::string said;
  peakbound::Run run(s, [&](const std::string& t) { said += t; });
  EXPECT_EQ(run.steps_done(), 3);
  EXPECT_EQ(bits_differ(master_of(run), saved_master), 0u);
  EXPECT_NE(said.find("--precision bf16 (the checkpoint's run: f32)"), std::string::npos) << said;
  std::vector<double> bf16_losses;
  while (!run.done()) bf16_losses.push_back(run.step().stats.loss);
  ASSERT_EQ(bf16_losses.size(), f32_losses.size());
  for (std::size_t i = 0; i < f32_losses.size(); ++i) {
    EXPECT_NEAR(bf16_losses[i], f32_losses[i], 2e-2 * f32_losses[i]) << "step " << i + 4;
    EXPECT_NE(bf16_losses[i], f32_losses[i]) << "step " << i + 4 << ": the resumed run is not bf16";
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
