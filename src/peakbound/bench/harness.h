// The shared shape of `peakbound bench`: timing with warm-up (on these machines the
// first pass over fresh memory runs 10-30x slower than later ones), and the machine
// description every benchmark's JSON carries. One harness, one JSON shape, many cases.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/stopwatch.h"

namespace peakbound::bench {

using peakbound::Stopwatch;  // core/stopwatch.h

// Runs f `warmup` times untimed, then `reps` times; returns the fastest run's seconds
// (the least disturbed by other work on a shared machine).
template <typename F>
double best_seconds(F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(reps, 1); ++i) {
    Stopwatch w;
    f();
    best = std::min(best, w.seconds());
  }
  return best;
}

// {"blas_core", "blas_threads", "hardware_threads", "version"}: printed with every result.
nlohmann::json machine_info();

// The 1, 5 and 15 minute load averages ("0.52 0.61 0.70"; "unknown" without /proc/loadavg):
// benches print them beside their timings.
std::string load_average();

// Gives each rank launched on this host (comm/launcher.h) an equal share of the cores as
// BLAS threads, so 4 ranks on 2 cores do not fight.
void share_cores_among_local_ranks();

// A collective step timed across the group: one untimed warm-up is the caller's; each
// of `reps` runs is bracketed by barriers, so a rep lasts as long as its slowest rank.
// Returns the fastest rep (the same value on every rank).
template <typename F>
double best_group_seconds(Communicator& g, F&& step, int reps) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(reps, 1); ++i) {
    g.barrier();
    Stopwatch w;
    step();
    g.barrier();
    best = std::min(best, w.seconds());
  }
  float b = static_cast<float>(best);
  g.all_reduce(&b, 1, DType::f32, ReduceOp::max);
  return b;
}

// max|a - ref| / max|ref| over a tensor distributed over the group (each rank its part).
double group_relative_error(Communicator& g, const std::vector<float>& a, const std::vector<float>& ref);

}  // namespace peakbound::bench
