// PhaseClock: where a training step's wall time goes. Code that does one kind of work
// opens a PhaseScope for it; the time between a scope's start and end is charged to its
// phase, less what scopes opened inside it take (so every second is counted once, in the
// innermost scope: the expert FFNs inside the dispatch's pass are "experts", the pass's
// staging and exchanges around them "dispatch"). Time outside every scope is the caller's
// to name ("other" is the step's wall time less the phases' sum).
//
// The accounting is per thread (thread_local): the scopes a copy engine or a communication
// thread opens are counted on that thread, not the step's, which is what a split of the
// step's critical path wants (work overlapped on another thread costs the step only where
// the step's thread waits for it, and that wait is inside the waiting scope).
// On the CPU device the compute stream runs inline on the calling thread, so a scope's
// time is its work's time. On an asynchronous device (CUDA) a scope would time the
// launches only, unless the thread has a boundary hook (below) that waits for the device
// at every scope boundary: then each phase's time is its work's, and the work of two
// phases no longer overlaps (a diagnostic: `train --sync-phases`, train/run.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace peakbound {

enum class StepPhase : std::uint8_t {
  attention,   // the attention sublayers (norm, projections, RoPE, the kernel, the ring's exchange)
  experts,     // the MLP sublayers: the router, the expert FFNs, shared experts, dense MLPs
  dispatch,    // the expert dispatch: packing, grouping, exchanges, combining, lending
  vocabulary,  // the vocabulary projection and cross-entropy (either schedule), with its collectives
  fsdp,        // FSDP gathers and reduce-scatters, the stores' gradient reduce-scatter and all-gather
  optimizer,   // the AdamW step (either placement) and the gradient norm
  other,       // the rest: embedding, final norm, residual adds, checkpoint boundaries, loss sums
};
inline constexpr std::size_t kNumStepPhases = 7;
inline constexpr std::array<StepPhase, kNumStepPhases> kAllStepPhases = {
    StepPhase::attention, StepPhase::experts,   StepPhase::dispatch, StepPhase::vocabulary,
    StepPhase::fsdp,      StepPhase::optimizer, StepPhase::other};
std::string_view step_phase_name(StepPhase p);

using PhaseSeconds = std::array<double, kNumStepPhases>;

// Charges its lifetime, less its inner scopes', to `phase` on this thread.
class PhaseScope {
 public:
  explicit PhaseScope(StepPhase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};

// This thread's seconds per phase since the last call (or the thread's start), then zeroed.
// Scopes still open keep counting from now.
PhaseSeconds take_phase_seconds();

// Runs `hook` on this thread at every scope boundary (a scope's start and end, and
// take_phase_seconds), before the clock is read; an empty function removes it. The hook
// waits for the device (Device::synchronize), so that the time charged to a phase is its
// work's on an asynchronous device. What the hook throws at a scope's end is kept and
// thrown at this thread's next boundary that may throw (a scope's start or
// take_phase_seconds), since a destructor must not throw.
void set_phase_boundary_hook(std::function<void()> hook);

// The communication the step waits for: time this thread spends inside a
// CommunicationScope (every call of the MPI communicator and of its requests, and a
// compute thread's wait for a communication stream), counted once where scopes nest. It
// cuts across the phases (an FSDP gather's MPI call is fsdp time and communication time)
// and is the step's exposed communication: what overlap has not hidden, waiting for a
// slower peer included. Transfers that run on another thread while this one computes are
// not in it; the wait for them is.
class CommunicationScope {
 public:
  CommunicationScope();
  ~CommunicationScope();
  CommunicationScope(const CommunicationScope&) = delete;
  CommunicationScope& operator=(const CommunicationScope&) = delete;
};

// This thread's seconds inside communication scopes since the last call, then zeroed; an
// open scope keeps counting from now.
double take_communication_seconds();

}  // namespace peakbound
