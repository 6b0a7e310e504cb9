// `peakbound plan`'s flags and what they plan, for callers that drive the command
// in-process (the Python package: python/src/module.cc builds this app, applies its
// keyword arguments as a --config file's keys, and plans).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/plan/plan.h"

namespace peakbound::cli {

// Every default comes from PlanInputs, whose knob defaults come from the schedules'
// own options structs: one place per default.
struct PlanFlags {
  PlanFlags();  // every default from PlanInputs (one place per default)
  std::string model = "deepseek-v3";
  std::string context = "128K";
  std::int64_t sequences, devices, cp, fsdp;
  std::string ep = "auto", vocab_group = "auto";
  std::string device_memory = "80GiB";
  std::string host_memory;
  std::int64_t devices_per_node;
  std::optional<std::int64_t> resident_layers;  // unset: the selective policy decides
  std::string schedules = "all";
  std::int64_t dispatch_cap;
  double llep_alpha, llep_lambda;
  std::int64_t llep_min_spill;
  std::int64_t vocab_chunk;
  std::int64_t prefetch_depth;
  std::int64_t checkpoint_group;
  std::string embedding = "auto";
  std::string context_attention = "auto";  // --context-attention
  std::string adam_bucket;
  std::string skew = "balanced";
  bool keep_attention = false;
  int attention_threads = 1;  // --attention-threads (--trainer-defaults: train's on this machine)
  bool keep_attention_given = false;  // --keep-attention given (else the budget's choice, as train's)
  bool keep_logits = false;
  bool keep_logits_given = false;  // --keep-logits given (else the budget's choice, as train's)
  bool keep_experts = false;
  bool keep_experts_given = false;  // --keep-experts given (else the budget's choice, as train's)
  bool device_memory_given = false;  // --device-memory given (else, with --trainer-defaults, train's auto)
  std::string cp_ring = "latent";  // --cp-ring (train's)
  std::string precision;            // --precision; empty: not given
  std::string param_dtype = "bf16";  // --param-dtype, the older spelling of --precision's parameter dtype
  std::string grad_dtype = "f32";
  std::string comm_reserve, workspace_reserve;
  bool reach = false;
  bool json = false;
  bool trainer_defaults = false;
};

// Adds every flag of `peakbound plan` to `a` (bound to f, which outlives it).
void add_plan_flags(CLI::App* a, PlanFlags& f);

// The plan of the flags as given to `a` (--precision and --trainer-defaults applied to f
// first): what `peakbound plan` prints. InvalidArgument / CLI errors, one line each.
Plan plan_from_flags(PlanFlags& f, const CLI::App& a);

}  // namespace peakbound::cli
