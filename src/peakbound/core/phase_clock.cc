#include "peakbound/core/phase_clock.h"

#include <chrono>

namespace peakbound {

namespace {

using Clock = std::chrono::steady_clock;

// The open scopes of this thread, innermost last. Deeper nesting than the stack holds is
// charged to the deepest scope kept (no code nests near that deep).
struct ThreadPhases {
  static constexpr int kDepth = 32;
  PhaseSeconds seconds{};
  StepPhase open[kDepth]{};
  int depth = 0;
  Clock::time_point last{};

  // Charge the time since the last boundary to the innermost open scope.
  Clock::time_point charge() {
    const Clock::time_point now = Clock::now();
    if (depth > 0) {
      const int top = depth <= kDepth ? depth - 1 : kDepth - 1;
      seconds[static_cast<std::size_t>(open[top])] += std::chrono::duration<double>(now - last).count();
    }
    last = now;
    return now;
  }
};

thread_local ThreadPhases t_phases;

// The communication scopes of this thread: the outermost one's time counts.
struct ThreadCommunication {
  double seconds = 0;
  int depth = 0;
  Clock::time_point since{};
};

thread_local ThreadCommunication t_comm;

}  // namespace

std::string_view step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::attention: return "attention";
    case StepPhase::experts: return "experts";
    case StepPhase::dispatch: return "dispatch";
    case StepPhase::vocabulary: return "vocabulary";
    case StepPhase::fsdp: return "fsdp";
    case StepPhase::optimizer: return "optimizer";
    case StepPhase::other: return "other";
  }
  return "?";
}

PhaseScope::PhaseScope(StepPhase phase) {
  ThreadPhases& t = t_phases;
  t.charge();
  if (t.depth < ThreadPhases::kDepth) t.open[t.depth] = phase;
  ++t.depth;
}

PhaseScope::~PhaseScope() {
  ThreadPhases& t = t_phases;
  t.charge();
  --t.depth;
}

PhaseSeconds take_phase_seconds() {
  ThreadPhases& t = t_phases;
  t.charge();
  const PhaseSeconds out = t.seconds;
  t.seconds = {};
  return out;
}

CommunicationScope::CommunicationScope() {
  ThreadCommunication& t = t_comm;
  if (t.depth++ == 0) t.since = Clock::now();
}

CommunicationScope::~CommunicationScope() {
  ThreadCommunication& t = t_comm;
  if (--t.depth == 0) t.seconds += std::chrono::duration<double>(Clock::now() - t.since).count();
}

double take_communication_seconds() {
  ThreadCommunication& t = t_comm;
  const Clock::time_point now = Clock::now();
  double out = t.seconds;
  if (t.depth > 0) {
    out += std::chrono::duration<double>(now - t.since).count();
    t.since = now;
  }
  t.seconds = 0;
  return out;
}

}  // namespace peakbound
