// peakbound as a library: a whole training run driven from C++ with the same object
// `peakbound train` uses (train/run.h). Trains the built-in tiny-moe model on the copy
// task for a few steps with every schedule on, prints what the run says, and checks
// that the loss fell and that every measured peak stayed within its plan. Exits 1 if
// not. Under mpirun it runs over the launched ranks, as `peakbound train` does.
#include <cstdio>
#include <string>

#include "peakbound/core/component.h"
#include "peakbound/core/error.h"
#include "peakbound/core/launcher.h"
#include "peakbound/train/run.h"
#include "peakbound/ops/gemm.h"

using namespace peakbound;

int main(int, char** argv) try {
  // First thing: where OpenBLAS fell back to its generic kernels on a CPU newer than it
  // knows, re-execute with the kernels this CPU allows (what `peakbound` itself does).
  ops::prefer_blas_kernels(argv);
  RunSettings s;  // every knob at `peakbound train`'s default: tiny-moe, the copy task, all schedules
  s.steps = 8;
  s.seq_len = 32;
  s.lr = 5e-3;
  s.eval_every = 4;
  s.validate(launcher_size());  // one line naming the setting, e.g. "seq_len must be at least 8, got 4"

  // The run's lines (the banner, the plan, the data, the end's table) go where we say.
  Run run(s, [](const std::string& text) { std::fputs(text.c_str(), stdout); });
  while (!run.done()) {
    const RunStep r = run.step();
    if (run.world().rank() == 0)
      std::printf("step %lld: loss %.4f, peak %llu bytes\n", static_cast<long long>(r.stats.step), r.stats.loss,
                  static_cast<unsigned long long>(r.report.device_peak_bytes));
  }
  const RunSummary sum = run.finish();
  bool within_plan = true;
  for (std::size_t i = 0; i <= kNumComponents; ++i) within_plan = within_plan && sum.measured[i] <= sum.planned[i];
  const bool fell = sum.last_loss < sum.first_loss;
  if (run.world().rank() == 0)
    std::printf("{\"first_loss\": %.6f, \"final_loss\": %.6f, \"loss_fell\": %s, \"within_plan\": %s}\n",
                sum.first_loss, sum.last_loss, fell ? "true" : "false", within_plan ? "true" : "false");
  return fell && within_plan ? 0 : 1;
} catch (const Error& e) {
  std::fprintf(stderr, "peakbound_run: error: %s\n", e.what());
  return 1;
}
