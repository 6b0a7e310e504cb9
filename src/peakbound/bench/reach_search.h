// The largest context a configuration trains at within a budget, found with real steps:
// doubling from a start until a step fails, then bisection between the last context that
// fitted and the first that did not. The search assumes that memory grows with the context
// (a context that fits implies every shorter one fits); it never tests a context twice.
//
//   start          first context tried; when it fails, halved until one fits (or the
//                  context drops below `multiple`: reach 0)
//   max_context    doubling stops here (reach = max_context when it fits: `capped`)
//   multiple       every context tried is a multiple of it
//   resolution     bisection stops when the gap is at most max(multiple, resolution x lo)
//
// `fits` runs the step and says whether it completed; it may throw (a failure that is not
// the budget's), which ends the search.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace peakbound::bench {

struct ReachSearchOptions {
  std::int64_t start = 256;
  std::int64_t max_context = std::int64_t{1} << 20;
  std::int64_t multiple = 64;
  double resolution = 1.0 / 16;
};

struct ReachTrial {
  std::int64_t context = 0;
  bool fits = false;
};

struct ReachSearch {
  std::int64_t reach = 0;          // the largest context that fitted (0: none did)
  std::int64_t first_failure = 0;  // the smallest context that failed (0: none did)
  bool capped = false;             // max_context fitted: the reach is at least this
  std::vector<ReachTrial> trials;  // in the order run
};

// Throws InvalidArgument for start < multiple, multiple < 1, max_context < start or a
// resolution outside (0, 1).
ReachSearch search_reach(const std::function<bool(std::int64_t)>& fits, const ReachSearchOptions& options);

}  // namespace peakbound::bench
