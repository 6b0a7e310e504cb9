// ScheduleSet: which of the four peak-bounding schedules replace their baseline rule, and
// the one mapping from that choice to the runtime's choices (the dispatch kind, the
// vocabulary loss, the checkpoint schedule, the optimizer schedule). The planner, the
// trainer and `bench reach` all read the set through here; its names are parsed once.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "peakbound/core/component.h"

#include "peakbound/schedules/checkpoint_policy.h"
#include "peakbound/schedules/moe_plan.h"

namespace peakbound {

struct ScheduleSet;

// One schedule: its name (in --schedules), its switch in ScheduleSet, the component whose
// peak it bounds and that state in words, and whether it moves that state to the host
// (then it is the one to drop when the host is what binds).
struct ScheduleInfo {
  std::string_view name;
  bool ScheduleSet::*on;
  Component bounds;
  std::string_view state;
  bool offloads;
};

struct ScheduleSet {
  bool llep = false;  // PipelinedLLEP for expert dispatch
  bool dtp = false;   // Ring-DTP for the vocabulary projection
  bool sco = false;   // Selective Checkpoint Offload for checkpoint boundaries
  bool adam = false;  // OffloadStreamAdamW for the optimizer state

  static ScheduleSet none() { return {}; }
  static ScheduleSet all() { return {true, true, true, true}; }
  bool any() const { return llep || dtp || sco || adam; }
  bool every() const { return llep && dtp && sco && adam; }
  // "none", "all", or a list of llep, dtp, sco, adam separated by ',' or '+'; throws
  // InvalidArgument naming `setting` (how the caller spells it: "schedules", or the
  // CLI's "--schedules") and the unknown item.
  static ScheduleSet parse(std::string_view text, std::string_view setting = "schedules");
  std::string str() const;  // "none", "all" or "llep,sco"

  // Every schedule, in the order names are printed (llep, dtp, sco, adam).
  static const std::array<ScheduleInfo, 4>& each();
  // The schedule that bounds `c`, or null when none does.
  static const ScheduleInfo* bounding(Component c);

  // The runtime's choice for each peak under this set.
  DispatchKind dispatch() const { return llep ? DispatchKind::pipelined_llep : DispatchKind::standard_ep; }
  bool ring_dtp() const { return dtp; }  // false: the materialized vocab-parallel baseline
  CheckpointSchedule checkpoint() const { return sco ? CheckpointSchedule::sco : CheckpointSchedule::resident; }
  // The optimizer schedule's name (optimizer_schedule.h make_optimizer).
  std::string_view optimizer() const { return adam ? "offload_stream" : "device"; }
};

}  // namespace peakbound
