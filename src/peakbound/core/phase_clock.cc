#include "peakbound/core/phase_clock.h"

#include <chrono>
#include <exception>
#include <utility>

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
  std::function<void()> hook;     // set_phase_boundary_hook's
  std::exception_ptr hook_error;  // what the hook threw at a scope's end, for the next boundary
  bool in_hook = false;           // the hook's own scopes (if any) run no hook

  // Run the hook; at a scope's end keep what it throws instead of throwing.
  void boundary(bool may_throw) {
    if (!hook || in_hook) return;
    if (may_throw && hook_error) std::rethrow_exception(std::exchange(hook_error, nullptr));
    in_hook = true;
    try {
      hook();
    } catch (...) {
      in_hook = false;
      if (may_throw) throw;
      if (!hook_error) hook_error = std::current_exception();
      return;
    }
    in_hook = false;
  }

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
  t.boundary(true);
  t.charge();
  if (t.depth < ThreadPhases::kDepth) t.open[t.depth] = phase;
  ++t.depth;
}

PhaseScope::~PhaseScope() {
  ThreadPhases& t = t_phases;
  t.boundary(false);
  t.charge();
  --t.depth;
}

PhaseSeconds take_phase_seconds() {
  ThreadPhases& t = t_phases;
  t.boundary(true);
  t.charge();
  const PhaseSeconds out = t.seconds;
  t.seconds = {};
  return out;
}

void set_phase_boundary_hook(std::function<void()> hook) {
  ThreadPhases& t = t_phases;
  t.hook = std::move(hook);
  t.hook_error = nullptr;
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
