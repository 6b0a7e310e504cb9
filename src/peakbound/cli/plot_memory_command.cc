// `peakbound plot-memory FILE [-o out.svg] [--step N]` and
// `peakbound plot-memory --compare A.json B.json`: one rank's memory timeline (the JSON
// `train --memory-timeline` writes, core/memory_timeline.h) drawn as an SVG (hand-written
// text, no dependency): over one step (default the last recorded), the live device bytes
// stacked by component (a fixed colour each, a legend), the budget as a dashed line, the
// phases as alternating bands named at the top (F3 = forward layer 3, B3 = its backward,
// which holds the layer's recomputation), and the step's peak marked with its binding
// component, the largest one at that instant. --compare draws two panels side by side
// on the same byte scale (e.g. schedules none and all at one context).
// The picture itself is drawn by cli/memory_plot.h.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/memory_plot.h"
#include "peakbound/core/error.h"
#include "peakbound/io/memory_timeline_file.h"
#include "peakbound/core/units.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/path_check.h"

namespace peakbound::cli {

namespace {

struct PlotFlags {
  std::string file, out;
  std::vector<std::string> compare;
  std::optional<std::int64_t> step;  // unset: the last recorded step
};

std::string default_out(const std::string& in) {
  const std::size_t slash = in.find_last_of('/'), dot = in.find_last_of('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) return in.substr(0, dot) + ".svg";
  return in + ".svg";
}

int run_plot(const PlotFlags& f) {
  std::vector<std::string> files = f.compare.empty() ? std::vector<std::string>{f.file} : f.compare;
  std::vector<StepView> views;
  for (const std::string& p : files) views.push_back(cut_step(read_memory_timeline(p), f.step.value_or(-1), p));
  const std::string out = f.out.empty() ? default_out(files.front()) : f.out;
  write_text_atomic(out, memory_svg(views));
  for (std::size_t i = 0; i < views.size(); ++i) {
    const StepView& v = views[i];
    const double pk = static_cast<double>(v.peak.total());
    std::printf("%s: step %lld, peak %s: %s %.0f%% (budget %s)\n", files[i].c_str(), static_cast<long long>(v.step),
                format_bytes(pk).c_str(), std::string(component_name(kAllComponents[v.binding])).c_str(),
                pk > 0 ? 100.0 * static_cast<double>(v.peak.live[v.binding]) / pk : 0.0,
                format_bytes(static_cast<double>(v.budget)).c_str());
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

Command add_plot_memory(CLI::App& parent) {
  auto f = std::make_shared<PlotFlags>();
  Command cmd;
  CLI::App* app = parent.add_subcommand(
      "plot-memory",
      "Draw one step of a memory timeline (train --memory-timeline) as an SVG: device bytes stacked by component, "
      "the budget, the phases and the peak with its binding component");
  cmd.app = app;
  app->add_option("file", f->file, "A timeline JSON (one rank's: t.json, or t.rank-R.json from a multi-rank run)");
  app->add_option("--compare", f->compare, "Two timelines side by side on the same byte scale (e.g. schedules none and all)")
      ->expected(2);
  text_flag(app, "-o,--out", f->out, "The SVG to write (default: the input's name with .svg)");
  optional_int_flag(app, "--step", f->step, "The step to draw (default: the last recorded)", 0, std::int64_t{1} << 40);
  cmd.validate = [f] {
    if (f->file.empty() == f->compare.empty())
      throw InvalidArgument("plot-memory: give one timeline FILE or --compare A.json B.json");
    // Before any read or write: inputs regular files, the SVG a regular file or new and
    // none of the inputs (t.svg's default output would be t.svg itself).
    std::vector<FlagPath> inputs;
    if (f->compare.empty()) inputs.push_back({"plot-memory", f->file});
    for (const std::string& p : f->compare) inputs.push_back({"--compare", p});
    for (const FlagPath& in : inputs) require_input_file(in.path, in.flag, "the JSON written by --memory-timeline");
    const FlagPath out{f->out.empty() ? "plot-memory's output (the input's name with .svg)" : "--out",
                       f->out.empty() ? default_out(inputs.front().path) : f->out};
    require_output_file(out.path, out.flag);
    refuse_same_file({out}, inputs);
  };
  cmd.run = [f] { return run_plot(*f); };
  return cmd;
}

const bool registered = register_command("", "plot-memory", add_plot_memory);

}  // namespace

}  // namespace peakbound::cli
