// Fuzz target: the memory-timeline reader `peakbound plot-memory` runs on a user's file
// (io/memory_timeline_file.h: read_memory_timeline, i.e. the JSON parser then
// MemoryTimeline::from_json), then its consumer, the picture (cli/memory_plot.h): the last
// step and the first step cut out and drawn as an SVG. On success the timeline survives a
// round trip through to_json/from_json, and the picture is one SVG document.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/cli/memory_plot.h"
#include "peakbound/io/memory_timeline_file.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::MemFile mem(data, size);
  fuzz::expect_ours([&] {
    const MemoryTimeline tl = read_memory_timeline(mem.path());
    const MemoryTimeline again = MemoryTimeline::from_json(tl.to_json());
    FUZZ_CHECK(again.events.size() == tl.events.size() && again.steps.size() == tl.steps.size() &&
               again.phases == tl.phases && again.initial == tl.initial);
    std::vector<cli::StepView> views{cli::cut_step(tl, -1, "fuzz.json")};
    views.push_back(cli::cut_step(tl, tl.steps.front().step, "fuzz.json"));
    for (const cli::StepView& v : views) FUZZ_CHECK(!v.samples.empty() && v.duration > 0);
    const std::string svg = cli::memory_svg(views);
    FUZZ_CHECK(svg.rfind("<svg ", 0) == 0 && svg.size() > 7 && svg.compare(svg.size() - 7, 7, "</svg>\n") == 0);
  });
  return 0;
}
