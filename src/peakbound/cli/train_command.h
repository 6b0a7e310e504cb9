// `peakbound train`'s flags, for callers that drive the command in-process (the Python
// package: python/src/module.cc builds this app, applies its settings as a --config
// file's keys, validates, and runs the library's Run on the RunSettings).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/core/precision.h"
#include "peakbound/train/run.h"

namespace peakbound::cli {

struct TrainFlags {
  RunSettings run;  // every knob and its default (train/run.h)
  std::string schedules = "all";
  std::string precision = std::string(precision_name(RunSettings{}.precision));  // parsed into run.precision
  bool json = false;
  // --keep-attention's switch; not given: run.keep_attention stays -1 (the budget's choice).
  bool keep_attention = false;
  bool keep_logits = false;  // --keep-logits's switch, the same way
  bool keep_experts = false;  // --keep-experts's
};

// Adds every flag of `peakbound train` to `app` (bound to f, which outlives it).
void add_train_flags(CLI::App* app, TrainFlags& f);

// What `train` checks before it runs, on every rank, no communication: the paths, the
// schedules and precision parsed into f.run, RunSettings::validate (errors name the flags).
void validate_train_flags(TrainFlags& f, CLI::App* app);

}  // namespace peakbound::cli
