// The least budget of a `bench reach` job (bench/reach_budget.h): the fixed state is the
// train footprint's persistent phases, it grows with neither schedule-independent nor
// routing terms, and check_reach_budget refuses just below the leanest configuration's
// minimum and accepts it. failure_reason names a silent child's command line and status.
#include <gtest/gtest.h>

#include "peakbound/bench/reach_budget.h"
#include "peakbound/bench/subprocess.h"
#include "peakbound/core/error.h"
#include "peakbound/model/presets.h"
#include "peakbound/train/train_footprint.h"

namespace peakbound::bench {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(ReachBudget, FixedStateIsTheTrainFootprintsPersistentPhase) {
  const ModelConfig c = preset_config("tiny-moe");
  const ParallelLayout layout{2, 2, 2};
  const ReachFixedState none = reach_fixed_state(c, layout, 2, 64, "none");
  const ReachFixedState adam = reach_fixed_state(c, layout, 2, 64, "adam");
  EXPECT_GT(none.bytes, 0u);
  EXPECT_LT(adam.bytes, none.bytes);  // the AdamW moments leave the device
  // Never more than the whole job's plan, at any context.
  TrainFootprintInputs in;
  in.model = c;
  in.layout = layout;
  in.world = 2;
  in.rank = none.rank;
  in.seq_len = 64;
  in.skew = 2;
  EXPECT_LE(none.bytes, train_footprint(in).device_peak_total());
  EXPECT_EQ(none.bytes, train_footprint(in).phase(none.phase).device_total());
  EXPECT_LE(none.bytes, reach_fixed_state(c, layout, 2, 1024, "none").bytes);
}

// Under bf16 (bench reach --precision bf16) the fixed state is the bf16 train footprint's:
// the parameters halve (fp32 master, gradients and m/v stay), so it is smaller than f32's.
TEST(ReachBudget, Bf16FixedStateIsTheBf16TrainFootprints) {
  const ModelConfig c = preset_config("tiny-moe");
  const ParallelLayout layout{2, 2, 2};
  for (const char* s : {"none", "all"}) {
    SCOPED_TRACE(s);
    const ReachFixedState f32 = reach_fixed_state(c, layout, 2, 64, s);
    const ReachFixedState b16 = reach_fixed_state(c, layout, 2, 64, s, Precision::bf16);
    EXPECT_LT(b16.bytes, f32.bytes);
    TrainFootprintInputs in;
    in.model = c;
    in.layout = layout;
    in.world = 2;
    in.rank = b16.rank;
    in.seq_len = 64;
    in.skew = 2;
    in.schedules.precision = Precision::bf16;
    EXPECT_LE(b16.bytes, train_footprint(in).device_peak_total());
    if (std::string(s) == "none") {
      EXPECT_EQ(b16.bytes, train_footprint(in).phase(b16.phase).device_total());
    }
  }
}

TEST(ReachBudget, RefusesBelowTheLeanestConfigurationNamingIt) {
  const ModelConfig c = preset_config("tiny-moe");
  const ParallelLayout layout{2, 2, 2};
  const std::vector<std::string> configs = {"none", "adam", "all"};
  std::uint64_t least = UINT64_MAX;
  for (const std::string& s : configs) least = std::min(least, reach_fixed_state(c, layout, 2, 64, s).bytes);
  EXPECT_NO_THROW(check_reach_budget(least, "--budget", c, layout, 2, 64, configs));
  try {
    check_reach_budget(least - 1, "--budget", c, layout, 2, 64, configs);
    FAIL() << "a budget one byte short was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--budget"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(least) + " bytes"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_THROW(check_reach_budget(0, "--budget", c, layout, 2, 64, {"bogus"}), InvalidArgument);
}

TEST(Subprocess, FailureReasonOfASilentChildNamesItsCommandLineAndStatus) {
  const std::vector<std::string> argv = {"false", "-np", "2"};
  const ProcessResult p = run_process(argv);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_EQ(failure_reason(argv, p), "`false -np 2` exited with status 1 and printed nothing");
  ProcessResult said;
  said.exit_code = 1;
  said.err = "some noise\npeakbound: error: the reason\nmore\n";
  EXPECT_EQ(failure_reason(argv, said), "the reason");
  said.err = "mpirun: first line\nmpirun: the last line\n\n";
  EXPECT_EQ(failure_reason(argv, said), "mpirun: the last line");
  EXPECT_THROW(require_program("/nonexistent/launcher", "--mpirun"), InvalidArgument);
  EXPECT_THROW(require_program("no-such-launcher-anywhere", "--mpirun"), InvalidArgument);
  EXPECT_NO_THROW(require_program("false", "--mpirun"));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::bench
