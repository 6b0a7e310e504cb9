// The shared shape of `peakbound bench`: timing with warm-up (on these machines the
// first pass over fresh memory runs 10-30x slower than later ones), and the machine
// description every benchmark's JSON carries. One harness, one JSON shape, many cases.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>

#include <nlohmann/json_fwd.hpp>

namespace peakbound::bench {

class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void restart() { t0_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point t0_;
};

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

}  // namespace peakbound::bench
