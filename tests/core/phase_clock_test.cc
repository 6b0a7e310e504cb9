#include "peakbound/core/phase_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "peakbound/core/stopwatch.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double of(const PhaseSeconds& s, StepPhase p) { return s[static_cast<std::size_t>(p)]; }

// Each second goes to the innermost open scope once: the outer scope's time excludes the
// inner one's, and the phases sum to at most the wall time around them. (Lower bounds
// only: a sleep lasts at least its time, never a fixed upper bound on a shared machine.)
TEST(PhaseClock, ChargesTheInnermostScopeOnce) {
  take_phase_seconds();
  Stopwatch wall;
  {
    const PhaseScope outer(StepPhase::dispatch);
    sleep_ms(20);
    {
      const PhaseScope inner(StepPhase::experts);
      sleep_ms(30);
    }
    sleep_ms(10);
  }
  const double total = wall.seconds();
  const PhaseSeconds s = take_phase_seconds();
  EXPECT_GE(of(s, StepPhase::dispatch), 0.030);
  EXPECT_GE(of(s, StepPhase::experts), 0.030);
  double sum = 0;
  for (double v : s) sum += v;
  EXPECT_LE(sum, total + 1e-9);
  // The outer scope's own time is its wall time less the inner scope's.
  EXPECT_LT(of(s, StepPhase::dispatch), total - of(s, StepPhase::experts) + 1e-9);
  EXPECT_EQ(of(s, StepPhase::attention), 0.0);
  EXPECT_EQ(of(s, StepPhase::other), 0.0);  // nothing opens "other": it is the caller's remainder
}

TEST(PhaseClock, TakeZeroesAndTimeOutsideScopesIsNotCounted) {
  take_phase_seconds();
  sleep_ms(10);  // in no scope
  const PhaseSeconds none = take_phase_seconds();
  for (double v : none) EXPECT_EQ(v, 0.0);
  {
    const PhaseScope a(StepPhase::optimizer);
    sleep_ms(5);
  }
  EXPECT_GE(of(take_phase_seconds(), StepPhase::optimizer), 0.005);
  for (double v : take_phase_seconds()) EXPECT_EQ(v, 0.0);
}

// A scope still open when the seconds are taken keeps counting from then on.
TEST(PhaseClock, AnOpenScopeSplitsAtTheTake) {
  take_phase_seconds();
  const PhaseScope a(StepPhase::vocabulary);
  sleep_ms(5);
  const PhaseSeconds first = take_phase_seconds();
  sleep_ms(5);
  const PhaseSeconds second = take_phase_seconds();
  EXPECT_GE(of(first, StepPhase::vocabulary), 0.005);
  EXPECT_GE(of(second, StepPhase::vocabulary), 0.005);
}

// Another thread's scopes are that thread's: the step's thread sees none of them.
TEST(PhaseClock, ScopesArePerThread) {
  take_phase_seconds();
  PhaseSeconds theirs{};
  std::thread t([&theirs] {
    {
      const PhaseScope a(StepPhase::fsdp);
      sleep_ms(10);
    }
    theirs = take_phase_seconds();
  });
  t.join();
  EXPECT_GE(of(theirs, StepPhase::fsdp), 0.010);
  EXPECT_EQ(of(take_phase_seconds(), StepPhase::fsdp), 0.0);
}

// Communication scopes count their outermost one's wall time once, across the phases,
// per thread; time outside them is not communication.
TEST(PhaseClock, CommunicationCountsTheOutermostScopeOnceAcrossPhases) {
  take_communication_seconds();
  take_phase_seconds();
  Stopwatch wall;
  {
    const PhaseScope fsdp(StepPhase::fsdp);
    sleep_ms(10);  // fsdp, not communication
    const CommunicationScope outer;
    sleep_ms(10);
    {
      const CommunicationScope inner;  // nested: not counted a second time
      sleep_ms(10);
    }
  }
  const double total = wall.seconds();
  const double comm = take_communication_seconds();
  EXPECT_GE(comm, 0.020);
  EXPECT_LT(comm, total - 0.010 + 1e-9);  // the first 10 ms were not in a communication scope
  EXPECT_GE(of(take_phase_seconds(), StepPhase::fsdp), 0.030);  // the phase keeps all of it
  sleep_ms(5);
  EXPECT_EQ(take_communication_seconds(), 0.0);
  double theirs = 0;
  std::thread t([&theirs] {
    {
      const CommunicationScope c;
      sleep_ms(10);
    }
    theirs = take_communication_seconds();
  });
  t.join();
  EXPECT_GE(theirs, 0.010);
  EXPECT_EQ(take_communication_seconds(), 0.0);
  // An open scope splits at the take.
  const CommunicationScope open;
  sleep_ms(5);
  EXPECT_GE(take_communication_seconds(), 0.005);
  sleep_ms(5);
  EXPECT_GE(take_communication_seconds(), 0.005);
}

TEST(PhaseClock, NamesEveryPhaseOnce) {
  std::string seen;
  for (StepPhase p : kAllStepPhases) {
    const std::string n(step_phase_name(p));
    EXPECT_NE(n, "?");
    EXPECT_EQ(seen.find("," + n + ","), std::string::npos) << n;
    seen += "," + n + ",";
  }
}

// The boundary hook runs before the clock is read at every scope start and end and at
// take_phase_seconds, on its own thread only; the time it takes goes to the scope it
// closes (what it waited for was that scope's work). What it throws at a scope's end is
// thrown at the next boundary that may throw, not from the destructor.
TEST(PhaseClock, BoundaryHookRunsAtEveryBoundaryAndDefersWhatItThrowsAtAnEnd) {
  take_phase_seconds();
  int calls = 0;
  set_phase_boundary_hook([&] {
    ++calls;
    sleep_ms(5);  // the "device" finishes the work launched so far
  });
  {
    const PhaseScope attention(StepPhase::attention);  // 1: charges the 5 ms to no scope
    {
      const PhaseScope experts(StepPhase::experts);  // 2: its 5 ms go to attention
    }                                                // 3: its 5 ms go to experts
  }                                                  // 4: attention again
  const PhaseSeconds s = take_phase_seconds();       // 5
  EXPECT_EQ(calls, 5);
  EXPECT_GE(of(s, StepPhase::attention), 0.010);
  EXPECT_GE(of(s, StepPhase::experts), 0.005);
  int other_thread_calls = 0;
  std::thread([&] {
    const PhaseScope elsewhere(StepPhase::fsdp);
    other_thread_calls = calls;
  }).join();
  EXPECT_EQ(other_thread_calls, 5);  // no hook on that thread

  bool fail = false;
  set_phase_boundary_hook([&] {
    if (fail) throw std::runtime_error("device failed");
  });
  {
    const PhaseScope scope(StepPhase::optimizer);
    fail = true;
  }  // the hook throws here: kept
  fail = false;
  try {
    take_phase_seconds();
    ADD_FAILURE() << "the kept error was not thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "device failed");
  }
  EXPECT_NO_THROW(take_phase_seconds());  // thrown once
  set_phase_boundary_hook({});
  const PhaseScope after(StepPhase::other);  // no hook: nothing runs
  EXPECT_EQ(calls, 5);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
