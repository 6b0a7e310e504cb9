// `peakbound train`: trains a Qwen3-MoE / Mixtral-style model (a preset, or a Hugging
// Face directory to start from its weights) on the built-in long-context task or a
// token file, over the launched ranks, with each of the four schedules on or off.
// Before step 1 it prints the plan (per-component device peak from the footprints) and
// refuses a configuration that does not fit; at the end the measured peaks beside it.
// The run itself is the library's (train/run.h): this command parses its flags into
// RunSettings, installs the stop signals and prints.
#include <csignal>
#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/cli/command.h"
#include "peakbound/cli/command_paths.h"
#include "peakbound/cli/config_file.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/train_command.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
#include "peakbound/core/launcher.h"
#include "peakbound/core/precision.h"
#include "peakbound/train/progress.h"
#include "peakbound/train/run.h"

namespace peakbound::cli {

namespace {

// SIGINT / SIGTERM / SIGUSR1 (what mpirun forwards): stop at the next micro-batch
// boundary, save the last complete step, exit 0. A second SIGINT or SIGTERM exits at
// once (checkpoints are atomic: a save in progress is simply not committed); a SIGUSR1
// only ever asks for the graceful stop.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0 && sig != SIGUSR1) {
    static const char kLine[] = "peakbound: second signal, exiting at once; the last complete checkpoint stays\n";
    ssize_t ignored = ::write(2, kLine, sizeof kLine - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
  if (g_stop_signal == 0) g_stop_signal = sig;
}
// The three signals share one handler, each blocking the others while it runs.
void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&sa.sa_mask, sig);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

// What the run says goes to stdout at once: a log file holds the start-up lines before
// step 1's long work, and an error line (stderr) comes after what explains it.
void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

int run_train(const TrainFlags& f) {
  // Before anything slow or collective: under mpirun a rank still building its model
  // (or still in MPI's start-up) when the forwarded SIGUSR1 arrives would otherwise die
  // of it while its peers stop gracefully. A signal during the start-up stops the run
  // at step 1's first micro-batch boundary.
  install_stop_signals();
  Run run(f.run, print, [] { return static_cast<std::int64_t>(g_stop_signal); });
  if (run.done()) return 0;  // a resume at or past --steps: nothing to train
  const bool lead = run.world().rank() == 0;
  // One line refreshed in place on a terminal; under mpirun the launcher hands every
  // rank a pseudo-terminal even when the job's output goes to a file, so plain lines.
  Progress progress(stdout, lead && !launched_by_mpi() && Progress::is_terminal(stdout));
  while (!run.done()) {
    RunStep r;
    try {
      r = run.step();
    } catch (const NonFinite& e) {
      // Every rank holds the same message: printed once, every rank exits 1, no abort.
      if (lead) {
        std::fprintf(stderr, "peakbound: error: %s; the run stops (lower --lr, or --on-nonfinite skip)%s\n", e.what(),
                     run.last_saved().empty() ? "" : ("; the last checkpoint is " + run.last_saved()).c_str());
        std::fflush(stderr);
      }
      return 1;
    }
    if (r.stats.stopped != 0) return run.stop(r);
    if (lead && r.report_due) progress.update(r.report);
    if (r.stop_signal != 0) return run.stop(r);
  }
  if (lead) progress.finish();
  const RunSummary sum = run.finish();
  if (lead && f.json) std::printf("%s\n", sum.json().dump().c_str());
  return 0;
}

}  // namespace

void add_train_flags(CLI::App* app, TrainFlags& ff) {
  TrainFlags* f = &ff;
  text_flag(app, "--model", f->run.model, "A preset name (see `peakbound info`) or a Hugging Face directory")
      ->capture_default_str();
  text_flag(app, "--data", f->run.data, "A token file (llm.c / nanoGPT format); default: the built-in task");
  text_flag(app, "--task", f->run.task,
            "The built-in task: copy (a random segment, then itself; the default), kv (key-value retrieval) or random "
            "(uniform random ids, every token scored: the data of the speed comparisons)");
  real_flag(app, "--eval-fraction", f->run.eval_fraction, "Held-out fraction of a token file", 1e-6, 0.5);
  int_flag(app, "--symbols", f->run.symbols, "Built-in task: distinct symbols (copy) or keys and values (kv); 0 = the whole vocabulary", 0,
           std::int64_t{1} << 30);
  int_flag(app, "--seq-len", f->run.seq_len, "Tokens per sequence (the sequence length's one name in every command)", 8, std::int64_t{1} << 24);
  int_flag(app, "--batch", f->run.batch, "Sequences per data-parallel rank (per --cp group) per micro-batch", 1, 1 << 20);
  int_flag(app, "--accumulation", f->run.accumulation, "Micro-batches per step (gradient accumulation)", 1, 1 << 20);
  int_flag(app, "--steps", f->run.steps, "Optimizer steps", 1, std::int64_t{1} << 40);
  real_flag(app, "--lr", f->run.lr, "Peak learning rate", 0.0, 10.0);
  real_flag(app, "--min-lr", f->run.min_lr, "Learning rate at the end of the cosine decay", 0.0, 10.0);
  int_flag(app, "--warmup", f->run.warmup, "Linear warm-up steps", 0, std::int64_t{1} << 40);
  real_flag(app, "--weight-decay", f->run.weight_decay, "AdamW weight decay", 0.0, 10.0);
  real_flag(app, "--max-grad-norm", f->run.max_grad_norm, "Global gradient-norm clipping (0 = off)", 0.0, 1e9);
  real_flag(app, "--bias-update-speed", f->run.bias_update_speed,
            "DeepSeek-V3's aux-loss-free balancing: per-step move of each router correction bias (0 = frozen)", 0.0,
            1.0);
  real_flag(app, "--seq-aux-coef", f->run.seq_aux_coef,
            "DeepSeek-V3's sequence-wise balance loss: its alpha (sigmoid routers; the report's 0.0001; 0 = off)", 0.0,
            1.0);
  text_flag(app, "--embedding", f->run.embedding,
            "The embedding: fsdp (an FSDP unit, gathered whole for its forward, its whole gradient in the backward), "
            "vocab (its rows sharded over the vocabulary group; each token's row fetched from its owner in rounds "
            "of 1024 tokens; CPU device) or auto (vocab on the CPU device under the schedules while the plan fits "
            "--device-memory with it, else fsdp)")
      ->capture_default_str();
  text_flag(app, "--context-attention", f->run.context_attention,
            "Attention under context parallelism (--cp > 1): ring (K/V travel round the group in pieces) or ulysses "
            "(the heads split over the group by all-to-all; --cp must divide the KV heads; not MLA; CPU device)")
      ->capture_default_str();
  text_flag(app, "--cp-ring", f->run.cp_ring,
            "What MLA's context-parallel ring carries: latent (the latent and the rope key per token, expanded at "
            "each hop) or kv (every head's K and V)")
      ->capture_default_str();
  real_flag(app, "--gemm-peak", f->run.gemm_peak,
            "The machine's GEMM peak in FLOP/s at the run's precision (peakbound info --json prints it), for the MFU "
            "the summary reports (0: none)",
            0.0, 1e19);
  app->add_flag("--measure-gemm-peak", f->run.measure_gemm_peak,
                "Measure the GEMM peak for the MFU after the last step: every rank at once at the run's precision, "
                "the ranks' rates summed (a few seconds; instead of --gemm-peak)");
  app->add_flag("--sync-phases", f->run.sync_phases,
                "Wait for the device at every phase boundary, so that a CUDA run reports the step's split by phase "
                "too (each phase's own time, no overlap between phases; the step runs slower)");
  app->add_flag("--keep-attention", f->keep_attention,
                "Keep every layer's attention output and log-sum-exp from the forward to its backward: the backward "
                "runs no attention forward, for L x T x (heads x v_dim) activations more on the device (the plan "
                "counts them). Not given: kept while the plan fits --device-memory with them (and --checkpoint-group "
                "is 1), else recomputed; --keep-attention=false always recomputes");
  app->add_flag("--keep-logits", f->keep_logits,
                "Keep the vocabulary loss's logits blocks (Ring-DTP, a vocabulary group of several ranks) from its "
                "forward to its backward: one GEMM of four fewer there, for [the group's tokens, vocab / group] fp32 "
                "more on the device (the plan counts them). Not given: kept while the plan fits --device-memory with "
                "them (with --device-memory auto: only where they do not raise the plan's peak), else recomputed; "
                "--keep-logits=false always recomputes");
  app->add_flag("--keep-experts", f->keep_experts,
                "Keep every MoE layer's routed experts' forward (gate, up, act and out of each row this rank "
                "computes) for its backward: the backward runs no expert forward, for about tokens x top-k x "
                "(3 x moe_ffn + hidden) activations a MoE layer more on the device (the plan counts them). Not "
                "given: kept while the plan fits --device-memory with them (with --device-memory auto: only where "
                "they do not raise the plan's peak), else recomputed; --keep-experts=false always recomputes");
  int_flag(app, "--moe-tile", f->run.moe_tile,
           "Rows per tile of every MLP sublayer (norm, router, dispatch, experts, residual), forward and backward, "
           "so its per-token buffers hold one tile: -1 the schedules' choice (1024 under PipelinedLLEP, whole "
           "otherwise), 0 whole",
           -1, std::int64_t{1} << 40);
  int_flag(app, "--prefetch-depth", f->run.prefetch_depth,
           "SCO: boundaries fetched ahead in backward (a ring of depth + 1 on the device); 0 is a one-slot ring "
           "whose copies wait; -1: 1 while the plan fits --device-memory with it, else 0",
           -1, 1024);
  int_flag(app, "--checkpoint-group", f->run.checkpoint_group,
           "Layers per checkpoint group: one boundary kept per group, the group's other inputs recomputed in its "
           "backward (fewer boundaries on the host or device, up to N - 1 more layer forwards a step and N - 1 more "
           "[tokens, hidden] on the device there; `peakbound plan` says the fewest that fit); 1: one per layer",
           1, ModelConfig::kMaxLayers);
  seed_flag(app, "--seed", f->run.seed, "Seed of the initialisation and the task");
  text_flag(app, "--schedules", f->schedules, "all, none, or a list of llep,dtp,sco,adam")->capture_default_str();
  text_flag(app, "--precision", f->precision,
            "bf16 (activations, compute parameters and communication in bf16; fp32 master weights, gradients, "
            "optimizer state and statistics) or f32 throughout")
      ->capture_default_str();
  int_flag(app, "--ep", f->run.ep, "Expert-parallel size (0 = the largest that divides ranks and experts)", 0, 1 << 24);
  int_flag(app, "--vocab-group", f->run.vocab_group, "Ranks sharing the LM head by vocabulary (0 = all)", 0, 1 << 24);
  int_flag(app, "--cp", f->run.cp, "Context-parallel size: consecutive ranks splitting every sequence (ring attention)", 1,
           1 << 24);
  device_flag(app, f->run.device);
  text_flag(app, "--device-memory", f->run.device_memory, "Device budget per rank (auto = the plan plus headroom)")
      ->capture_default_str();
  int_flag(app, "--eval-every", f->run.eval_every, "Held-out loss every N steps (0 = at the end only)", 0,
           std::int64_t{1} << 40);
  int_flag(app, "--eval-batches", f->run.eval_batches, "Held-out micro-batches per evaluation (0 = no evaluation)", 0,
           1 << 20);
  text_flag(app, "--metrics", f->run.metrics, "Write one JSON object per step to this file (JSONL)");
  app->add_flag("--json", f->json, "Print a JSON summary at the end");
  app->add_flag("!--no-plan-check", f->run.plan_check,
                "Start even when the plan exceeds --device-memory: the device's arena refuses what does not fit "
                "(what `bench reach` uses to find the largest context by real steps)");
  real_flag(app, "--plan-skew", f->run.plan_skew,
            "Routing imbalance the plan reserves dispatch memory for (busiest rank's load over the mean; 0 = the "
            "worst the layout allows)",
            0.0, 1e9);
  text_flag(app, "--save-dir", f->run.save_dir,
            "Write checkpoints here (step-N folders, a `latest` pointer): every --save-every steps, at the end, and "
            "on SIGINT/SIGTERM");
  int_flag(app, "--save-every", f->run.save_every, "Checkpoint every N steps (0 = at the end only)", 0,
           std::int64_t{1} << 40);
  int_flag(app, "--keep", f->run.keep, "Checkpoints kept in --save-dir (the newest)", 1, 1 << 20);
  text_flag(app, "--resume", f->run.resume,
            "Continue from the latest checkpoint in this folder (or a step folder); --steps stays the run's total");
  text_flag(app, "--on-nonfinite", f->run.on_nonfinite,
            "A non-finite loss or gradient: stop (name the step and the tensor; the last checkpoint stays) or skip "
            "the step's update")
      ->capture_default_str();
  text_flag(app, "--memory-timeline", f->run.memory_timeline,
            "Record every device allocation and release (time, component, bytes, phase) and write them as JSON "
            "for `peakbound plot-memory`: this file on one rank, else one per rank with .rank-R before the "
            "extension (t.json -> t.rank-0.json)");
  add_config_flag(app);
}

void validate_train_flags(TrainFlags& f, CLI::App* app) {
  // The paths first (cli/command_paths.h): no output over an input, no FIFO or device.
  check_command_paths(app, {.inputs = {{"--data", f.run.data}}, .model = f.run.model, .checkpoint = f.run.resume,
                            .outputs = {{"--metrics", f.run.metrics}}, .memory_timeline = f.run.memory_timeline,
                            .world = launcher_size()});
  f.run.schedules = ScheduleSet::parse(f.schedules, "--schedules");
  f.run.precision = parse_precision(f.precision, "--precision");
  if (app->count("--keep-attention") > 0) f.run.keep_attention = f.keep_attention ? 1 : 0;
  if (app->count("--keep-logits") > 0) f.run.keep_logits = f.keep_logits ? 1 : 0;
  if (app->count("--keep-experts") > 0) f.run.keep_experts = f.keep_experts ? 1 : 0;
  f.run.validate(launcher_size(), flag_spelling);  // errors name the flags (train/run.h)
}

namespace {

Command add_train(CLI::App& parent) {
  auto f = std::make_shared<TrainFlags>();
  Command cmd;
  cmd.collective = true;
  CLI::App* app = parent.add_subcommand(
      "train", "Train a Mixture-of-Experts model with the four peak-bounding schedules (over mpirun ranks)");
  cmd.app = app;
  add_train_flags(app, *f);
  cmd.validate = [f, app] { validate_train_flags(*f, app); };
  cmd.run = [f] { return run_train(*f); };
  return cmd;
}

const bool registered = register_command("", "train", add_train);

}  // namespace

}  // namespace peakbound::cli
