// MemoryTimeline: the Arena's allocation events over time, for a picture of one step
// (`peakbound plot-memory`). Off by default; an Arena records only between
// start_timeline() and take_timeline(). Each event is one allocate (+bytes) or release
// (-bytes) with the ledger's rounded bytes (multiples of 256), its Component, the time
// since recording started and the phase current at that moment. Phases are names set
// by the code that runs (MemoryPhase below: "forward layer 3", "loss", "optimizer"),
// interned once (phases[id]) so an event stays 24 bytes. Steps mark their begin and
// end (time and event index) so a plot can cut one step out of a run.
// The live bytes of component c after event i are
//   initial[c] + sum over events j <= i with component c of delta_j,
// which equals the ledger's live(c) at that moment (tests check it).
// At most max_events events are kept; past that `truncated` is set and later events
// are dropped (phase and step marks still count).
// JSON (one object; arrays kept compact because events are many):
//   {"rank", "world", "budget_bytes", "components": [names], "phases": [names],
//    "initial_live_bytes": [per component], "events": [[t, component, delta, phase], ...],
//    "phase_marks": [[t, phase, event_index], ...],
//    "steps": [{"step", "t_begin", "t_end", "event_begin", "event_end"}], "truncated",
//    "title" (optional text), "meta" (optional object)}
// Files (naming per rank, atomic write, checked read) are io/memory_timeline_file.h.
// Not thread-safe: the Arena that owns one locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/ledger.h"

namespace peakbound {

class Arena;

struct MemoryEvent {
  double t = 0;             // seconds since recording started
  std::int64_t delta = 0;   // +bytes allocated, -bytes released
  std::uint32_t phase = 0;  // index into MemoryTimeline::phases
  std::uint8_t component = 0;
};

struct MemoryPhaseMark {
  double t = 0;
  std::uint32_t phase = 0;
  std::uint64_t event_index = 0;  // the number of events recorded before the mark
};

struct MemoryStepMark {
  std::int64_t step = 0;
  double t_begin = 0, t_end = -1;  // t_end < 0: the step has not ended
  std::uint64_t event_begin = 0, event_end = 0;
};

struct MemoryTimeline {
  static constexpr std::uint64_t kDefaultMaxEvents = 4u << 20;

  int rank = 0, world = 1;
  std::uint64_t budget_bytes = 0;
  std::vector<std::string> phases{"(none)"};  // phase 0: before any phase is set
  ComponentBytes initial{};                   // live bytes per component when recording started
  std::vector<MemoryEvent> events;
  std::vector<MemoryPhaseMark> phase_marks;
  std::vector<MemoryStepMark> steps;
  bool truncated = false;
  std::uint64_t max_events = kDefaultMaxEvents;
  std::string title;
  std::string meta;  // a JSON object's text (free-form: model, schedules, ...), empty: none

  // The id of a phase name, added if new.
  std::uint32_t intern(std::string_view name);

  nlohmann::json to_json() const;
  // Throws InvalidArgument naming the bad field ("memory timeline: events[3] ..."). Besides
  // the shape it requires: times within +-1e9 s; no release of more bytes than are live;
  // live bytes (all components together) at most 2^62; rank < world <= INT_MAX.
  static MemoryTimeline from_json(const nlohmann::json& j);
};

// Sets the Arena's current phase until the next one is set (phases in sequence: the
// forward's layers one after another). One branch when the Arena is not recording.
void mark_phase(Arena& arena, const char* name, std::int64_t index = -1);

// Sets the Arena's current phase for its lifetime and restores the previous one at the
// end. Costs one branch when the Arena is not recording (the name is not even built):
// MemoryPhase p(arena, "backward layer", l) names the phase "backward layer 3".
class MemoryPhase {
 public:
  MemoryPhase(Arena& arena, const char* name, std::int64_t index = -1);
  ~MemoryPhase();
  MemoryPhase(const MemoryPhase&) = delete;
  MemoryPhase& operator=(const MemoryPhase&) = delete;

 private:
  Arena* arena_ = nullptr;  // null: the Arena was not recording
  std::uint32_t previous_ = 0;
};

}  // namespace peakbound
