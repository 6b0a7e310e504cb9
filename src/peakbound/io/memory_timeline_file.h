// The file of a MemoryTimeline (core/memory_timeline.h): the per-rank name
// `--memory-timeline FILE` becomes, the atomic write and the checked read. Kept in io/
// so that core (the Arena records the timeline) does not reach up into the file layer.
#pragma once

#include <string>

#include "peakbound/core/memory_timeline.h"

namespace peakbound {

// The file one rank writes for `--memory-timeline FILE`: FILE itself when world == 1,
// otherwise ".rank-R" before the extension (timeline.json -> timeline.rank-0.json; a
// name without an extension gets it at the end).
std::string memory_timeline_path(const std::string& file, int rank, int world);

// Writes the timeline's JSON to `path` (whole or not at all); Error naming the path.
void write_memory_timeline(const std::string& path, const MemoryTimeline& t);
// Reads one; InvalidArgument naming the path and the bad field.
MemoryTimeline read_memory_timeline(const std::string& path);

}  // namespace peakbound
