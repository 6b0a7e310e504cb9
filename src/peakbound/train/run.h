// A training run as one library object: RunSettings holds every knob with its one
// default, Run owns everything a run needs (the device, the groups, the model, the
// trainer, the data, the plan and its budget, checkpoints, metrics, the memory timeline)
// and steps it. `peakbound train` parses its flags into RunSettings and prints what the
// Run says; a program using the installed library drives the same object
// (examples/consumer/run.cc). Every function here is collective over the launched ranks
// unless it says otherwise.
//
//   RunSettings s;                 // defaults: tiny-moe, the copy task, every schedule
//   s.steps = 20;
//   s.validate(world_size);        // one line naming the setting ("seq_len must be ...")
//   Run run(s, print);             // plan, refusal over budget, setup, resume
//   while (!run.done()) run.step();
//   RunSummary sum = run.finish(); // planned beside measured peaks, the losses
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/schedule_set.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/train/process_groups.h"
#include "peakbound/train/progress.h"
#include "peakbound/train/train_footprint.h"
#include "peakbound/train/trainer.h"

namespace peakbound {

// How the errors of RunSettings::validate spell a setting. A setting's name is its
// field's ("seq_len", "device_memory"); the CLI's flag for it is the same name with
// '-' for '_' after "--" ("--seq-len"), so `peakbound train` passes flag_spelling and
// its one-line errors name the flag the user typed.
using SettingSpelling = std::string (*)(std::string_view field);
std::string field_spelling(std::string_view field);  // "seq_len" -> "seq_len"
std::string flag_spelling(std::string_view field);   // "seq_len" -> "--seq-len"

struct RunSettings {
  // The model: a preset name (`peakbound info`) or a Hugging Face directory; the seed of
  // its initialisation (a preset) and of the built-in task.
  std::string model = "tiny-moe";
  std::uint64_t seed = 1;
  // The data: a token file (llm.c / nanoGPT format) or, empty, the built-in task.
  std::string data;
  std::string task;              // the built-in task: "copy" (empty: copy) or "kv"; not with data
  double eval_fraction = 0.05;   // held-out fraction of a token file
  std::int64_t symbols = 64;     // the task's distinct symbols (0: the whole vocabulary)
  // A step: accumulation micro-batches of batch sequences of seq_len tokens per
  // data-parallel rank (per cp group).
  std::int64_t seq_len = 128, batch = 1, accumulation = 1, steps = 300;
  // AdamW under a linear warm-up and a cosine decay from lr to min_lr over the steps.
  double lr = 2e-3, min_lr = 2e-4;
  std::int64_t warmup = 10;
  double weight_decay = 0.0, max_grad_norm = 1.0, beta2 = 0.95;
  std::string on_nonfinite = "stop";  // stop (NonFinite names the tensor) or skip the update
  // DeepSeek-V3's auxiliary-loss-free balancing: each step moves every MoE layer's
  // e_score_correction_bias by this much per expert against its load error (0: frozen).
  // Used by models with a score-correction bias only.
  double bias_update_speed = 0.001;
  // DeepSeek-V3's complementary sequence-wise balance loss's alpha (sigmoid routers only;
  // ModelConfig::seq_aux_loss_coef); 0: off (the report trains with 0.0001).
  double seq_aux_coef = 0.0;
  // What MLA's context-parallel ring carries: "latent" (the latent and the rope key) or
  // "kv" (every head's K and V; ModelConfig::mla_latent_ring). Other attention ignores it.
  std::string cp_ring = "latent";  // read by latent_cp_ring (below)
  // How attention runs under context parallelism (cp > 1): "ring" (K/V round the group) or
  // "ulysses" (the heads split over the group by all-to-all; cp must divide the KV heads;
  // not MLA). The same losses to fp32 rounding; `peakbound plan` says which peak is smaller.
  std::string context_attention = "ring";
  // The machine's GEMM peak in FLOP/s at the run's precision (`peakbound info --json`'s
  // gemm.f32_flops_per_second or bf16_flops_per_second), for the MFU the summary reports;
  // 0: not given (no MFU).
  double gemm_peak = 0.0;
  // Instead: measure that peak after the last step, every rank at once (the run's
  // precision and threads, ops/gemm_rate.h's square products), and take the ranks' sum:
  // what the launched ranks can do together on this machine.
  bool measure_gemm_peak = false;
  // Keep every layer's attention output and log-sum-exp from the forward to its backward
  // (ModelSchedules::keep_attention): no attention forward in the backward, for a per-layer
  // per-token term on the device. -1: the budget's choice (kept while the plan fits
  // device_memory with it and the stack keeps a boundary per layer, else recomputed), 0:
  // recomputed, 1: kept. The plan of --device-memory auto counts it.
  int keep_attention = -1;
  // Ring-DTP keeps the forward's logits blocks for the backward (VocabLossOptions::
  // keep_logits): one GEMM of four fewer in the vocabulary projection, for [the vocabulary
  // group's tokens, V/P] fp32 more from the loss's forward to its backward (the plan counts
  // it). -1: the budget's choice (kept while the plan fits device_memory with them; with
  // device_memory auto, only where they do not raise the plan's peak), 0: recomputed, 1:
  // kept. Only a vocabulary group of several ranks has them (one rank takes the fused
  // form, which computes each block once already).
  int keep_logits = -1;
  // Every MoE layer keeps its routed experts' forward (gate, up, act, out of every row its
  // rank computes) for its backward (ModelSchedules::keep_experts): no expert forward in
  // the backward, 3 of an expert row's 12 GEMMs a step, for every MoE layer's
  // dispatch_kept_buffer on the device at once (the plan counts it). -1: the budget's
  // choice (kept while the plan fits device_memory with them, dropped first; with
  // device_memory auto, only where they do not raise the plan's peak), 0: recomputed, 1: kept.
  int keep_experts = -1;
  // The MLP sublayers' row tile (ModelSchedules::moe_tile): -1 the schedules' choice
  // (kMoeTileRows under PipelinedLLEP, whole otherwise), 0 whole, else rows.
  std::int64_t moe_tile = -1;
  // SCO's ring (CheckpointOptions::prefetch_depth): -1 the budget's choice (1 while the plan
  // fits device_memory with it, else 0), else the depth (0: a one-slot ring, every copy
  // waited for).
  std::int64_t prefetch_depth = -1;
  // Layers per checkpoint group (CheckpointOptions::group_layers): the stack keeps one
  // boundary per group and recomputes the group's other inputs in its backward (up to G - 1
  // more layer forwards a step, G - 1 more [T, H] on the device there). 1: one per layer.
  std::int64_t checkpoint_group = 1;
  // The embedding: "fsdp" (an FSDP unit, gathered whole for its forward, its whole [V, H]
  // gradient reduce-scattered), "vocab" (its rows sharded over the vocabulary group, each
  // token's row fetched from its owner, ModelSchedules::vocab_parallel_embedding; CPU
  // device), or "auto": the budget's choice, vocab while the plan fits device_memory with it
  // on the CPU device under the schedules (less to move: a row per token instead of the
  // whole table twice a step), else fsdp. The baseline (schedules none) is FSDP's.
  std::string embedding = "auto";
  // Wait for the device at every phase boundary of a step (core/phase_clock.h), so that
  // an asynchronous device (CUDA) reports phase_seconds too: each phase's own time, with
  // no overlap between phases (a diagnostic; the step runs slower). The CPU device reports
  // its phases without it.
  bool sync_phases = false;
  // The four schedules and the layout (ep 0: the largest dividing the ranks and the
  // experts; vocab_group 0: every rank; cp: consecutive ranks splitting each sequence).
  ScheduleSet schedules = ScheduleSet::all();
  std::int64_t ep = 0, vocab_group = 0, cp = 1;
  // The device and its budget per rank: "auto" is auto_device_budget of the plan
  // (core/footprint.h), else a size ("24GiB"). plan_check false starts a run over budget
  // (the Arena refuses what does not fit). plan_skew: the routing imbalance the plan
  // reserves dispatch memory for (0: the worst the layout allows).
  std::string device = "cpu";
  std::string device_memory = "auto";
  // The numeric mode (core/precision.h, docs/precision.md): bf16 activations and compute
  // parameters with fp32 master weights, gradients and optimizer state, or f32
  // throughout. The model's (ModelSchedules::precision) and the plan's. The CLI parses
  // it with parse_precision (its one-line error names --precision). bf16 by default, as
  // the runs this engine is for are trained; f32 is bit for bit what it was before bf16.
  Precision precision = Precision::bf16;
  bool plan_check = true;
  double plan_skew = 0;
  // The held-out loss every eval_every steps (0: at the end only) over eval_batches
  // micro-batches (0: never).
  std::int64_t eval_every = 50, eval_batches = 4;
  // Checkpoints in save_dir every save_every steps (0: at the end and on a stop), the
  // newest `keep`; resume: a checkpoint folder (or step folder) to continue from.
  std::string save_dir, resume;
  std::int64_t save_every = 0;
  int keep = 3;
  // Outputs: one JSON object per step (JSONL), and the device's allocation timeline
  // (one file per rank past one: io/memory_timeline_file.h). Empty: none.
  std::string metrics, memory_timeline;

  std::string task_name() const { return task.empty() ? "copy" : task; }
  // Every check a run makes before it builds anything, for `world` ranks: the values,
  // the model and layout, the task or token file, the budget's text, a resume's
  // compatibility (train/run_resume.h), and last the save folder, which it creates.
  // InvalidArgument, one line naming the setting as `spell` writes it. (Errors from the
  // model spec, the layout and a resume name the CLI's flags: model_spec.h, run_resume.h.)
  void validate(int world, SettingSpelling spell = field_spelling) const;
};

// The schedule set's runtime choices for the model (ScheduleSet's one mapping; the
// optimizer's is ScheduleSet::optimizer()) under the run's precision. Each schedule's
// options keep their defaults.
ModelSchedules model_schedules(const ScheduleSet& set, Precision precision = Precision::f32);

// What the settings resolve to before anything is built.
struct RunShape {
  ModelConfig config;
  ParallelLayout layout;
  ModelSchedules schedules;  // the schedule set's runtime choices (ScheduleSet) and the precision
};
RunShape resolve_run(const RunSettings& s, int world, SettingSpelling spell = field_spelling);

// The attention kernel's shares a rank of a `world`-rank run on the CPU device takes
// (ModelSchedules::attention_threads): the rank's cores, this machine's hardware threads over
// the ranks on it (the launcher's local count; without a launcher, as in `plan`, all
// `world`), at least 1. resolve_run sets it where the device is the CPU, and the planner
// for its trainer footprint, so a plan on this machine counts the workspace slots the run
// allocates (one wherever the ranks are as many as the cores).
int cpu_attention_threads(int world);

// The trainer's footprint inputs of rank `rank` (the plan the Run checks before step 1;
// `plan --trainer-defaults` builds its estimate from these, so the two cannot disagree).
TrainFootprintInputs run_footprint_inputs(const RunSettings& s, const RunShape& shape, int world, int rank);

// The part of a run every command that runs a model shares: the device and its budget,
// host memory, the world communicator upgraded to the device's, a thread pool, the
// process groups and the model (a Hugging Face directory's weights, or a preset
// initialised from `seed`). Failures on some ranks are agreed: one line, no abort.
struct RunModel {
  RunModel(std::unique_ptr<Communicator> world, const std::string& device, std::uint64_t budget,
           const std::string& model_spec, const ModelConfig& config, const ParallelLayout& layout,
           const ModelSchedules& schedules, std::uint64_t seed);
  ~RunModel();
  std::unique_ptr<Device> device;
  HostMemory host;
  std::unique_ptr<Communicator> world;
  ThreadPool pool;
  ProcessGroups groups;
  std::optional<MoeTransformer> model;
};

// What the Run says, the lead rank's lines, each ending in '\n' (the CLI writes them to
// stdout); an empty printer is silent.
using RunPrinter = std::function<void(const std::string& text)>;

// One step's outcome, the same on every rank but for the timings in `report`
// (tokens_per_second, elapsed_seconds), which are each rank's own.
struct RunStep {
  StepStats stats;                 // the trainer's; stats.stopped: a stop abandoned the step
  StepReport report;               // a progress line's figures (peak: the largest over ranks)
  bool report_due = false;         // about 20 a run, the first and the last, and each evaluation
  std::int64_t stop_signal = 0;    // a stop seen after the step (any rank): call Run::stop()
  std::int64_t skipped_steps = 0;  // steps the run has skipped so far (on_nonfinite skip)
  // The step as one line of the metrics file (RunSettings::metrics, written by rank 0): the
  // progress line's figures, the loss's two terms, the scored tokens, whether it was skipped.
  nlohmann::json json() const;
};

// The end of a run: planned beside measured peaks (largest over ranks) and the losses.
// RunSettings::cp_ring (or plan's --cp-ring) as ModelConfig::mla_latent_ring: true for
// "latent", false for "kv"; anything else is InvalidArgument "<spelled> must be latent or kv".
bool latent_cp_ring(const std::string& value, const std::string& spelled);
// RunSettings::context_attention (or plan's --context-attention ring|ulysses) as
// ModelConfig::ulysses_attention; InvalidArgument naming `spelled` for any other value.
bool ulysses_context_attention(const std::string& value, const std::string& spelled);

struct RunSummary {
  std::vector<std::int64_t> planned, measured, at_peak;  // per component, then the total (at_peak: none)
  std::uint64_t budget = 0;
  double first_loss = 0, last_loss = 0, tokens_per_second = 0, blind_loss = 0;  // blind: NaN if unknown
  // model_flops_per_token (model/model_flops.h, the head's part for the scored tokens:
  // scored_fraction of the inputs had a target) x tokens_per_second, and its share of the
  // given GEMM peak (RunSettings::gemm_peak; absent when not given).
  double model_flops_per_token = 0, achieved_flops_per_second = 0, scored_fraction = 1;
  std::optional<double> mfu;
  double gemm_peak = 0;  // the peak the MFU is against (given or measured); 0: none
  // The steps' wall time split by phase (core/phase_clock.h), summed over the steps, the
  // mean over ranks: on the CPU device, or with RunSettings::sync_phases on any (absent
  // otherwise). The phases sum to the train time (tokens_per_second's denominator) of
  // the mean rank.
  std::optional<PhaseSeconds> phase_seconds;
  bool phases_synchronized = false;  // phase_seconds were taken with sync_phases
  // The steps' exposed communication (StepStats::communication_seconds), summed over the
  // steps, the mean over ranks; with phase_seconds.
  std::optional<double> communication_seconds;
  std::optional<double> eval_loss;
  std::int64_t steps = 0, skipped = 0;
  std::string text() const;          // the table and the loss line, as `peakbound train` prints them
  nlohmann::json json() const;       // the same and the run's shape (`train --json`)
  nlohmann::json run;                // model, precision, ranks, cp, schedules, steps, inputs_per_step, step_seconds
};

class Run {
 public:
  // Builds the run of validated settings over the launched ranks: plans, refuses a plan
  // over budget (AgreedError) or over the machine's memory, sets up, resumes. `stop` is
  // asked between micro-batches and after each step (a signal number, or 0).
  Run(const RunSettings& settings, RunPrinter print = {}, StopCheck stop = {});
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Every step taken (also at once, when a resume finds nothing to train).
  bool done() const;
  std::int64_t steps_done() const;
  // The next step: its micro-batches, the update, the held-out loss when due, the
  // metrics line, a checkpoint when due. Throws NonFinite (on every rank) under
  // on_nonfinite stop; last_saved() names the checkpoint to go back to.
  RunStep step();
  // The held-out loss of the current parameters (settings' eval_batches).
  double evaluate();
  // Saves the last complete step now and waits for it (needs save_dir).
  void save();
  // The same into `dir`: the run's save_dir, or, for a run started without one, the folder
  // it becomes from now on (claimed as save_dir is at the start; InvalidArgument, one
  // line, for another folder than the run's).
  void save(const std::string& dir);
  // After a step whose stats.stopped or stop_signal is set: saves the last complete
  // step (save_dir), says where to resume; returns the exit status (0 saved, 130 not).
  int stop(const RunStep& last);
  // After the last step: waits for the saves, writes the memory timeline, measures.
  RunSummary finish();
  const std::string& last_saved() const;
  Trainer& trainer();
  Communicator& world();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace peakbound
