// The picture `peakbound plot-memory` draws (cli/plot_memory_command.cc), as pure functions
// of a parsed timeline so the command and the fuzz target (tests/fuzz) share them: cut_step
// takes one step out of a MemoryTimeline (core/memory_timeline.h) as a StepView (the
// live bytes per component after each event of the step, the phase bands, the peak and its
// binding component, the largest one at that instant); memory_svg draws one panel per view
// side by side on one byte scale (hand-written SVG text, no dependency): the live device
// bytes stacked by component (a fixed colour each, a legend), the budget as a dashed line,
// the phases as alternating bands named at the top (F3 = forward layer 3, B3 = its
// backward) and the peak marked. The live bytes after event i of component c are
//   initial[c] + sum over events j <= i with component c of delta_j.
// The stacked areas follow every event when there are few; with more than about two per
// pixel column each column shows the state at its highest total (an upper envelope, so no
// peak is lost). Errors: InvalidArgument (one line).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/core/memory_timeline.h"

namespace peakbound::cli {

// One state of the step: time (seconds from the step's begin) and live bytes per component.
struct Sample {
  double t = 0;
  ComponentBytes live{};
  std::uint64_t total() const {
    std::uint64_t s = 0;
    for (std::uint64_t v : live) s += v;
    return s;
  }
};

// A phase band: from t0 to t1 (seconds from the step's begin), the phase's name.
struct Band {
  double t0, t1;
  std::string name;
};

// What one panel shows: a step cut out of a timeline.
struct StepView {
  std::string title;
  std::int64_t step = 0;
  double duration = 0;
  std::uint64_t budget = 0;
  std::vector<Sample> samples;  // in order; samples[0] at t = 0
  std::vector<Band> bands;
  Sample peak;
  std::size_t binding = 0;
  std::array<bool, kNumComponents> used{};
  bool truncated = false;
};

// Step `want` of `tl` (want < 0: the last recorded); `path` names the timeline in errors and
// is the title when the timeline has none. InvalidArgument when there is no such step.
// `tl` is what MemoryTimeline::from_json accepts (times and byte counts in its bounds).
StepView cut_step(const MemoryTimeline& tl, std::int64_t want, const std::string& path);

// The byte scale's top for one view: its peak or budget, whichever is higher, plus 6 %.
double y_top(const StepView& v);

// The whole SVG document: the views' panels side by side on the scale of the highest y_top.
std::string memory_svg(const std::vector<StepView>& views);

}  // namespace peakbound::cli
