// `peakbound plan`: per-component peaks for a model, context and layout, baseline
// (FSDP2-style) beside the chosen schedules, the phase and component that bind,
// whether each fits, what would make it fit, and with --reach the context reach.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "peakbound/cli/command.h"
#include "peakbound/cli/config_file.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/plan_command.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/core/precision.h"
#include "peakbound/core/units.h"
#include "peakbound/core/values.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/presets.h"
#include "peakbound/plan/plan.h"
#include "peakbound/train/run.h"

namespace peakbound::cli {

namespace {

// "2TiB" for 2^41: a byte count in the largest binary unit that divides it.
std::string format_bytes_exact(std::uint64_t b) {
  if (b == 0) return "0";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + units[u];
}

// --precision bf16|f32 (train's): parameters and activations 2 or 4 bytes; gradients
// (--grad-dtype, f32 by default) and optimizer state 4. --param-dtype, the older
// spelling, sets the same parameter and activation dtype: alone it rules, with
// --precision it must agree (a contradiction is one line). Neither: bf16.
void apply_precision(PlanFlags& f, const CLI::App& a) {
  if (a.count("--precision") == 0) return;
  const Precision p = parse_precision(f.precision, "--precision");
  const std::string named(precision_name(p));
  if (a.count("--param-dtype") > 0 && shard_dtype(f.param_dtype, "--param-dtype") != param_dtype(p))
    throw InvalidArgument("--precision " + named + " and --param-dtype " + f.param_dtype +
                          " contradict (--param-dtype is the older spelling of the same dtype): give one");
  f.param_dtype = named;
}

// --trainer-defaults: the settings of a `peakbound train` run, for each flag not given
// explicitly: train's default precision, no fixed reserves, unlimited host memory, and
// the worst routing skew (train's --plan-skew default), a boundary per layer (train's
// --checkpoint-group).
void apply_trainer_defaults(PlanFlags& f, const CLI::App& a) {
  if (a.count("--param-dtype") == 0 && a.count("--precision") == 0)
    f.param_dtype = std::string(precision_name(RunSettings{}.precision));
  if (a.count("--comm-reserve") == 0) f.comm_reserve = "0";
  if (a.count("--workspace-reserve") == 0) f.workspace_reserve = "0";
  if (a.count("--host-memory") == 0) f.host_memory = "0";
  if (a.count("--skew") == 0) f.skew = "worst";
  if (a.count("--checkpoint-group") == 0) f.checkpoint_group = RunSettings{}.checkpoint_group;
  if (a.count("--embedding") == 0) f.embedding = RunSettings{}.embedding;
  if (a.count("--context-attention") == 0) f.context_attention = RunSettings{}.context_attention;
  if (a.count("--attention-threads") == 0) f.attention_threads = cpu_attention_threads(static_cast<int>(f.devices));
}

ModelConfig load_model(const std::string& spec) {
  namespace fs = std::filesystem;
  const bool looks_like_path = spec.find('/') != std::string::npos || spec.ends_with(".json");
  std::error_code ec;  // a symlink loop or unreadable path is the importer's to report
  if (looks_like_path || fs::exists(fs::symlink_status(spec, ec))) return load_hf_config(spec);
  return preset_config(spec);
}

double parse_skew(const std::string& s) {
  if (s == "balanced") return 1.0;
  if (s == "worst") return 0.0;
  try {
    return parse_real(s, "--skew", 1.0, 1e6);
  } catch (const InvalidArgument&) {
    throw InvalidArgument("--skew: '" + s + "' is not 'balanced', 'worst' or a finite factor in [1, 1e6]");
  }
}


PlanInputs to_inputs(const PlanFlags& f) {
  PlanInputs in;
  in.model = load_model(f.model);
  in.model.mla_latent_ring = latent_cp_ring(f.cp_ring, "--cp-ring");
  in.context = static_cast<std::int64_t>(parse_count(f.context, "--seq-len"));
  in.sequences = f.sequences;
  in.devices = f.devices;
  in.ep = f.ep == "auto" ? 0 : static_cast<std::int64_t>(parse_count(f.ep, "--ep"));
  in.cp = f.cp;
  in.vocab_group = f.vocab_group == "auto" ? 0 : static_cast<std::int64_t>(parse_count(f.vocab_group, "--vocab-group"));
  if (f.ep != "auto" && in.ep == 0) throw InvalidArgument("--ep must be positive or 'auto'");
  if (f.vocab_group != "auto" && in.vocab_group == 0) throw InvalidArgument("--vocab-group must be positive or 'auto'");
  in.fsdp = f.fsdp;
  in.device_memory = parse_bytes(f.device_memory, "--device-memory");
  in.host_memory = parse_bytes(f.host_memory, "--host-memory");
  in.devices_per_node = f.devices_per_node;
  in.resident_layers = f.resident_layers;
  in.schedules = ScheduleSet::parse(f.schedules, "--schedules");
  in.dispatch_cap = f.dispatch_cap;
  in.llep_alpha = f.llep_alpha;
  in.llep_lambda = f.llep_lambda;
  in.llep_min_spill = f.llep_min_spill;
  in.vocab_chunk = f.vocab_chunk;
  in.prefetch_depth = f.prefetch_depth;
  in.checkpoint_group = f.checkpoint_group;
  in.embedding = f.embedding;
  in.context_attention = f.context_attention;
  in.adam_bucket = parse_bytes(f.adam_bucket, "--adam-bucket");
  in.skew = parse_skew(f.skew);
  in.keep_attention = f.keep_attention;
  in.attention_threads = f.attention_threads;
  in.keep_attention_by_budget = !f.keep_attention_given;
  in.keep_logits = f.keep_logits;
  in.keep_logits_by_budget = !f.keep_logits_given;
  in.keep_experts = f.keep_experts;
  in.keep_experts_by_budget = !f.keep_experts_given;
  in.device_memory_auto = f.trainer_defaults && !f.device_memory_given;
  DType pd = shard_dtype(f.param_dtype, "--param-dtype"), gd = shard_dtype(f.grad_dtype, "--grad-dtype");
  in.param_bytes = in.activation_bytes = static_cast<std::int64_t>(dtype_size(pd));
  in.grad_bytes = static_cast<std::int64_t>(dtype_size(gd));
  in.comm_reserve = parse_bytes(f.comm_reserve, "--comm-reserve");
  in.workspace_reserve = parse_bytes(f.workspace_reserve, "--workspace-reserve");
  return in;
}

}  // namespace

PlanFlags::PlanFlags() {
  const PlanInputs d;
  sequences = d.sequences, devices = 8, cp = d.cp, fsdp = d.fsdp;
  dispatch_cap = d.dispatch_cap, llep_alpha = d.llep_alpha, llep_lambda = d.llep_lambda;
  llep_min_spill = d.llep_min_spill;
  vocab_chunk = d.vocab_chunk, prefetch_depth = d.prefetch_depth, checkpoint_group = d.checkpoint_group;
  adam_bucket = std::to_string(d.adam_bucket);
  comm_reserve = std::to_string(d.comm_reserve), workspace_reserve = std::to_string(d.workspace_reserve);
  host_memory = format_bytes_exact(d.host_memory);
  devices_per_node = d.devices_per_node;
}

void add_plan_flags(CLI::App* a, PlanFlags& ff) {
  PlanFlags* f = &ff;
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  a->add_option("--model", f->model, "Preset (" + presets + ") or a Hugging Face config.json (file or folder)")->capture_default_str();
  a->add_option("--seq-len,--context", f->context, "Tokens per sequence: 131072, 128K, 1M (--context: the old name)")
      ->capture_default_str();
  int_flag(a, "--sequences", f->sequences, "Sequences per step per data-parallel group", 1, kMaxSequences);
  int_flag(a, "--devices", f->devices, "Number of devices", 1, kMaxDevices);
  a->add_option("--ep", f->ep, "Expert-parallel size, or auto: the largest divisor of devices and experts up to 64")->capture_default_str();
  int_flag(a, "--cp", f->cp, "Context-parallel size (each sequence split over cp devices)", 1, kMaxDevices);
  a->add_option("--cp-ring", f->cp_ring,
                "What MLA's context-parallel ring carries (train's --cp-ring): latent (latent + rope key per token) or "
                "kv (every head's K and V)")
      ->capture_default_str();
  a->add_option("--vocab-group", f->vocab_group, "Devices sharing one vocabulary-sharded LM head, or auto: the largest divisor of devices up to 8")->capture_default_str();
  int_flag(a, "--fsdp", f->fsdp, "FSDP shard group of the non-expert parameters (0 = all devices)", 0, kMaxDevices);
  a->add_option("--device-memory", f->device_memory,
                "Memory of each device planned for (its capacity, not an arena budget: no auto here): 80GiB, 141GiB")
      ->capture_default_str();
  a->add_option("--host-memory", f->host_memory, "Host memory per node, shared by its devices (0 = unlimited)")->capture_default_str();
  int_flag(a, "--devices-per-node", f->devices_per_node, "Devices sharing one node's host memory", 1, 1024);
  optional_int_flag(a, "--resident-layers", f->resident_layers,
                    "SCO: keep the last K checkpoint boundaries on the device (default: the selective policy: "
                    "offload all but the ring, or keep as few as make the host memory fit)",
                    0, ModelConfig::kMaxLayers);
  text_flag(a, "--schedules", f->schedules, "none, all, or a comma list of llep, dtp, sco, adam");
  int_flag(a, "--dispatch-cap", f->dispatch_cap, "PipelinedLLEP: token-copies per source rank per round", 1, kMaxRows);
  real_flag(a, "--llep-alpha", f->llep_alpha, "LLEP capacity factor over the mean load", 1.0, 1e6);
  real_flag(a, "--llep-lambda", f->llep_lambda, "LLEP: routing imbalance (busiest rank over the mean) below which nothing spills", 1.0, 1e6);
  int_flag(a, "--llep-min-spill", f->llep_min_spill, "LLEP: smallest spilled piece in token-copies", 1, kMaxRows);
  int_flag(a, "--vocab-chunk", f->vocab_chunk, "Ring-DTP: token rows per logits block", 1, kMaxRows);
  int_flag(a, "--prefetch-depth", f->prefetch_depth, "SCO: boundaries prefetched ahead in backward (0: a one-slot ring whose copies wait; -1: 1 while the plan fits "
           "with it, else 0)", -1, 1024);
  int_flag(a, "--checkpoint-group", f->checkpoint_group,
           "SCO: one checkpoint boundary per group of this many layers, the group's other inputs recomputed in its "
           "backward (train's --checkpoint-group; -1: 1, or the fewest that make the plan fit)",
           -1, ModelConfig::kMaxLayers);
  a->add_option("--embedding", f->embedding,
                "The scheduled side's embedding (train's --embedding): fsdp, vocab (sharded over the vocabulary "
                "group), or auto (train's default): vocab where the plan fits with it, else fsdp (the smaller peak where "
                "neither fits; the reach takes the better at each context)")
      ->capture_default_str();
  a->add_option("--context-attention", f->context_attention,
                "The scheduled side's attention under --cp > 1 (train's --context-attention): ring, ulysses (the "
                "heads split over the cp group), or auto: Ulysses where it gives the smaller peak and cp can split "
                "the heads (the reach takes the better at each context); the baseline's is the ring")
      ->capture_default_str();
  a->add_option("--adam-bucket", f->adam_bucket, "OffloadStreamAdamW bucket size")->capture_default_str();
  a->add_flag("--keep-attention", f->keep_attention,
              "train's --keep-attention: every layer's attention output and log-sum-exp held from its forward to "
              "its backward. Not given: as train, kept while the plan fits --device-memory with them (and one "
              "boundary per layer), else recomputed; --keep-attention=false always recomputes");
  a->add_flag("--keep-logits", f->keep_logits,
              "train's --keep-logits: Ring-DTP's logits blocks held from the loss's forward to its backward (a "
              "vocabulary group of several devices). Not given: as train, kept while the plan fits --device-memory "
              "with them, else computed again; --keep-logits=false always computes them again");
  a->add_flag("--keep-experts", f->keep_experts,
              "train's --keep-experts: every MoE layer's routed experts' forward (gate, up, act, out of each row a "
              "device computes) held for its backward. Not given: as train, kept while the plan fits "
              "--device-memory with them (dropped first), else computed again (with --trainer-defaults and no "
              "--device-memory, as train's --device-memory auto: only where they do not raise the peak); "
              "--keep-experts=false always computes it again");
  int_flag(a, "--attention-threads", f->attention_threads,
           "The CPU attention kernel's shares a rank runs, a workspace slot each (train on the CPU device: the "
           "rank's cores, this machine's hardware threads over the ranks on it; --trainer-defaults takes that)",
           1, 1 << 16);
  a->add_option("--skew", f->skew, "Routing skew at the busiest EP rank: balanced, worst, or a factor >= 1")->capture_default_str();
  a->add_option("--precision", f->precision,
                "What `train --precision` runs: bf16 (parameters and activations 2 bytes) or f32 (4); gradients "
                "(--grad-dtype) and optimizer state 4 (default: bf16, or train's with --trainer-defaults)");
  a->add_option("--param-dtype", f->param_dtype,
                "Parameter and activation dtype (bf16, f32): the older spelling of --precision; both must agree")
      ->capture_default_str();
  a->add_option("--grad-dtype", f->grad_dtype, "Gradient shard dtype (f32, bf16)")->capture_default_str();
  a->add_option("--comm-reserve", f->comm_reserve, "Fixed reserve for the runtime and communication buffers")->capture_default_str();
  a->add_option("--workspace-reserve", f->workspace_reserve, "Fixed reserve for GEMM workspace and slack")->capture_default_str();
  a->add_flag("--reach", f->reach, "Also search the largest context that fits, baseline and scheduled");
  a->add_flag("--json", f->json, "Print one JSON object");
  a->add_flag("--trainer-defaults", f->trainer_defaults,
              "Plan what `peakbound train` runs: train's default --precision, no reserves, unlimited host memory, the "
              "worst skew (each unless given); with a trainable model and --fsdp 0 the peaks are then the trainer's "
              "own footprint");
  add_config_flag(a);
}

Plan plan_from_flags(PlanFlags& f, const CLI::App& a) {
  apply_precision(f, a);
  f.keep_attention_given = a.count("--keep-attention") > 0;
  f.keep_logits_given = a.count("--keep-logits") > 0;
  f.keep_experts_given = a.count("--keep-experts") > 0;
  f.device_memory_given = a.count("--device-memory") > 0;
  if (f.trainer_defaults) apply_trainer_defaults(f, a);
  return make_plan(to_inputs(f), f.reach);
}

namespace {

Command add_plan_command(CLI::App& root) {
  auto f = std::make_shared<PlanFlags>();
  Command c;
  c.app = root.add_subcommand("plan", "Per-component memory peaks, baseline vs schedules, binding component, context reach");
  auto* a = c.app;
  add_plan_flags(a, *f);
  c.run = [f, a] {
    const Plan p = plan_from_flags(*f, *a);
    if (f->json)
      std::printf("%s\n", plan_json(p).dump(2).c_str());
    else
      std::printf("%s", plan_table(p).c_str());
    return 0;
  };
  return c;
}

const bool registered = register_command("", "plan", &add_plan_command);

}  // namespace

}  // namespace peakbound::cli
