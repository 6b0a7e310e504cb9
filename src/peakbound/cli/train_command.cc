// `peakbound train`: trains a Qwen3-MoE / Mixtral-style model (a preset, or a Hugging
// Face directory to start from its weights) on the built-in long-context task or a
// token file, over the launched ranks, with each of the four schedules on or off.
// Before step 1 it prints the plan (per-component device peak from the footprints) and
// refuses a configuration that does not fit; at the end the measured peaks beside it.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/command_paths.h"
#include "peakbound/comm/agree.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/cli/config_file.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/model_spec.h"
#include "peakbound/cli/train_resume.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/io/memory_timeline_file.h"
#include "peakbound/core/system_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/core/units.h"
#include "peakbound/device/device.h"
#include "peakbound/model/describe.h"
#include "peakbound/plan/plan_inputs.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/train/progress.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/sequence_source.h"
#include "peakbound/train/train_footprint.h"
#include "peakbound/train/trainer.h"

namespace peakbound::cli {

namespace {

struct TrainFlags {
  std::string device = "cpu";  // --device
  std::string model = "tiny-moe";
  std::string data;  // empty: the built-in task
  std::string task = "copy";
  double eval_fraction = 0.05;
  std::int64_t symbols = 64;
  std::int64_t seq_len = 128;
  std::int64_t batch = 1;
  std::int64_t accumulation = 1;
  std::int64_t steps = 300;
  double lr = 2e-3, min_lr = 2e-4;
  std::int64_t warmup = 10;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  std::uint64_t seed = 1;
  std::string schedules = "all";
  std::int64_t ep = 0, vocab_group = 0, cp = 1;
  std::string device_memory = "auto";
  std::int64_t eval_every = 50, eval_batches = 4;
  std::string metrics;
  bool json = false;
  double plan_skew = 0;  // 0: the worst the layout allows (every copy to one rank: ep)
  std::string save_dir, resume;
  std::int64_t save_every = 0;  // 0: at the end (and on SIGINT / SIGTERM) only
  int keep = 3;
  std::string on_nonfinite = "stop";
  bool plan_check = true;  // refuse a plan over --device-memory before step 1
  std::string memory_timeline;  // empty: not recorded
};

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

struct Setup {
  ModelConfig config;
  ScheduleSet set;
  ModelSchedules schedules;
  std::string optimizer;
  ParallelLayout layout;
};

Setup make_setup(const TrainFlags& f, std::int64_t world) {
  Setup s;
  s.config = load_model_spec(f.model);
  check_trainable(s.config);
  s.set = ScheduleSet::parse(f.schedules);
  s.schedules.dispatch = s.set.llep ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
  s.schedules.ring_dtp = s.set.dtp;
  s.schedules.checkpoint.schedule = s.set.sco ? CheckpointSchedule::sco : CheckpointSchedule::resident;
  s.optimizer = s.set.adam ? "offload_stream" : "device";
  s.layout = resolve_layout(f.ep, f.vocab_group, f.cp, s.config, world);
  check_cp_seq_len(f.cp, f.seq_len, "--seq-len");
  if (!f.data.empty()) return s;
  if (f.task == "kv") KvRetrievalTask::standard(s.config.vocab_size, f.seq_len, f.seed, f.symbols).validate();
  else if (f.task == "copy") CopyTask{s.config.vocab_size, f.seq_len, f.symbols, f.seed}.validate();
  else throw InvalidArgument("--task must be copy or kv, got '" + f.task + "'");
  return s;
}

TrainFootprintInputs footprint_inputs(const TrainFlags& f, const Setup& s, int world, int rank) {
  TrainFootprintInputs in;
  in.model = s.config;
  in.layout = s.layout;
  in.world = world;
  in.rank = rank;
  in.sequences = f.batch;
  in.seq_len = f.seq_len;
  in.schedules = s.schedules;
  in.optimizer = s.optimizer;
  in.evaluates = f.eval_batches > 0;  // the held-out loss's forward is a moment of the run too
  // The dispatch's memory depends on the routing, which the run decides: the plan
  // reserves for the skew given, by default the worst (every token-copy to one rank).
  in.skew = f.plan_skew > 0 ? std::min(f.plan_skew, static_cast<double>(s.layout.ep))
                            : static_cast<double>(s.layout.ep);
  return in;
}

// Plain progress lines: about 20 per run, and the first and the last step.
bool progress_every(std::int64_t step, std::int64_t steps) {
  const std::int64_t every = std::max<std::int64_t>(1, steps / 20);
  return step == 1 || step == steps || step % every == 0;
}

// The refusal of a plan over budget: the three largest components, each with the
// schedule that bounds it when that schedule is off, and the fixes.
std::string over_budget(const std::vector<std::int64_t>& planned, std::uint64_t total, std::uint64_t budget,
                        const ScheduleSet& on) {
  std::vector<std::size_t> order(kNumComponents);
  for (std::size_t i = 0; i < kNumComponents; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return planned[a] > planned[b]; });
  std::string parts, fixes;
  for (std::size_t k = 0; k < 3; ++k) {
    const Component c = kAllComponents[order[k]];
    const char* sched = c == Component::dispatch ? (on.llep ? nullptr : "llep")
                        : c == Component::vocab ? (on.dtp ? nullptr : "dtp")
                        : c == Component::checkpoints ? (on.sco ? nullptr : "sco")
                        : c == Component::optimizer ? (on.adam ? nullptr : "adam")
                                                    : nullptr;
    parts += std::string(k ? ", " : "") + std::string(component_name(c)) + " " +
             format_bytes(static_cast<double>(planned[order[k]])) + (sched ? std::string(" (bounded by ") + sched + ")" : "");
    if (sched) fixes += std::string(fixes.empty() ? "" : ",") + sched;
  }
  return "the plan needs " + format_bytes(static_cast<double>(total)) + " per device, over the " +
         format_bytes(static_cast<double>(budget)) + " budget; largest: " + parts + "; fix: " +
         (fixes.empty() ? std::string("") : "add " + fixes + " to --schedules, or ") +
         "shorten --seq-len or --batch, or raise --device-memory";
}

// The plan against the machine's memory (core/system_memory.h), before anything large is
// allocated: on the CPU device the arena's budget is RAM; on every device the host side
// (the footprint's host peak: offloaded optimizer state and boundaries, staging; the
// batches' token arrays; with --save-dir the checkpoint's copy of the optimizer state).
// The ranks on this machine each plan as much as the largest rank. Collective.
void check_machine_memory(const TrainFlags& f, const Setup& s, const Footprint& plan, std::uint64_t budget,
                          Communicator& world) {
  const double tokens = static_cast<double>(f.batch) * static_cast<double>(f.seq_len);
  const double batches = 2.0 * 4.0 * tokens * static_cast<double>(f.accumulation + f.eval_batches);
  const std::uint64_t optimizer_state = plan.device_peak(Component::optimizer) + plan.host_peak(Component::optimizer);
  const double host = static_cast<double>(plan.host_peak_total()) + batches +
                      (f.save_dir.empty() ? 0.0 : static_cast<double>(optimizer_state));
  std::int64_t host_i = host >= 9.2e18 ? std::int64_t{9200000000000000000} : static_cast<std::int64_t>(host);
  world.all_reduce(&host_i, 1, DType::i64, ReduceOp::max);
  MachineNeed need;
  need.device_bytes = f.device == "cpu" ? budget : 0;
  need.host_bytes = static_cast<std::uint64_t>(host_i);
  need.local_ranks = launcher_local_size();
  std::string fix = f.device == "cpu" && f.device_memory != "auto"
                        ? "lower --device-memory (or omit it: automatic is the plan plus headroom), shorten --seq-len or --batch"
                        : "shorten --seq-len or --batch";
  if (batches > static_cast<double>(need.host_bytes) / 2) fix += ", lower --accumulation";
  if (!(s.set.llep && s.set.dtp && s.set.sco && s.set.adam)) fix += ", turn on more --schedules";
  fix += ", or spread the run over more machines (more ranks, fewer per machine)";
  // Machines may differ (several nodes): one line, from the lowest rank whose machine is short.
  agree(world, [&] { check_fits_machine(need, machine_memory(), fix); });
}

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.insert(0, w - s.size(), ' ');
  return s;
}

// The run's record in its checkpoints (RunState.run): what defines it and what a resume
// may change (cli/train_resume.h).
nlohmann::json run_record(const TrainFlags& f, const Setup& s, std::int64_t world) {
  return {{"model", f.model}, {"schedules", s.set.str()}, {"seq_len", f.seq_len}, {"batch", f.batch},
          {"accumulation", f.accumulation}, {"steps", f.steps}, {"lr", f.lr}, {"cp", s.layout.cp},
          {"ep", s.layout.ep}, {"vocab_group", s.layout.vocab}, {"ranks", world},
          {"data", f.data.empty() ? nlohmann::json(nullptr) : data_identity(f.data)},
          {"task", f.data.empty() ? nlohmann::json(f.task) : nlohmann::json(nullptr)}, {"symbols", f.symbols},
          {"seed", f.seed}, {"save_every", f.save_every}, {"eval_every", f.eval_every}};
}

// Collective: --save-dir becomes this run's (its lock, its identity; run_checkpoint.h)
// before anything is built. A resumed run is the run its checkpoint names; a checkpoint
// from before run ids makes the folder it was resumed from this run's.
void claim_save_dir(CheckpointWriter& writer, const TrainFlags& f, const nlohmann::json& record, Communicator& world) {
  std::string id;
  bool adopt = false;
  if (!f.resume.empty()) {
    const std::string from = resolve_checkpoint(f.resume);
    const nlohmann::json m = read_checkpoint_manifest(from);
    if (m.contains("run_id") && m["run_id"].is_string()) id = m["run_id"].get<std::string>();
    std::error_code ec;
    if (id.empty()) adopt = std::filesystem::equivalent(std::filesystem::path(from).parent_path(), f.save_dir, ec);
  }
  if (id.empty()) id = new_run_id();
  writer.claim(world, id, record, adopt);
}

int run_train(const TrainFlags& f) {
  bench::share_cores_among_local_ranks();
  auto world = world_communicator();
  const int W = world->size(), rank = world->rank();
  const bool lead = rank == 0;
  const Setup s = make_setup(f, W);
  const ModelConfig& c = s.config;
  const nlohmann::json record = run_record(f, s, W);
  // Saves overlap training: the state is copied at the step, the files are written by a
  // thread, and the checkpoint is committed at the first step boundary where every rank's
  // files are written (or at once when the run stops).
  std::optional<CheckpointWriter> writer;
  if (!f.save_dir.empty()) {
    writer.emplace(f.save_dir, SaveOptions{f.keep});
    claim_save_dir(*writer, f, record, *world);
    if (lead && !writer->locked())
      std::printf("note: %s is on a file system without locks: a second run on it is not detected while this one "
                  "runs\n", f.save_dir.c_str());
  }

  // The plan: this rank's footprint, the largest over ranks (vocabulary shards differ).
  const Footprint plan = train_footprint(footprint_inputs(f, s, W, rank));
  ComponentBytes planned = plan.device_peak();
  std::vector<std::int64_t> planned_i(kNumComponents + 1);
  for (std::size_t i = 0; i < kNumComponents; ++i) planned_i[i] = static_cast<std::int64_t>(planned[i]);
  planned_i[kNumComponents] = static_cast<std::int64_t>(plan.device_peak_total());
  world->all_reduce(planned_i.data(), planned_i.size(), DType::i64, ReduceOp::max);
  const std::uint64_t planned_total = static_cast<std::uint64_t>(planned_i[kNumComponents]);
  // Auto budget: the plan plus the Arena's placement reserve and 1/16 headroom.
  const std::uint64_t budget = f.device_memory == "auto"
                                   ? planned_total + planned_total / 16 + (8u << 20)
                                   : parse_bytes(f.device_memory, "--device-memory");
  if (lead) {
    std::printf("peakbound train: %s (%s), %lld parameters, %d ranks (cp %lld, ep %lld, vocab group %lld), schedules %s\n",
                c.name.c_str(), c.family.c_str(), static_cast<long long>(TensorTable(c).total_numel()), W,
                static_cast<long long>(s.layout.cp), static_cast<long long>(s.layout.ep),
                static_cast<long long>(s.layout.vocab), s.set.str().c_str());
    std::printf("plan (per device, from the footprints): peak %s of %s budget\n", format_bytes(double(planned_total)).c_str(),
                format_bytes(double(budget)).c_str());
    std::string row;
    for (std::size_t i = 0; i < kNumComponents; ++i)
      if (planned_i[i] > 0)
        row += std::string(row.empty() ? "  " : ", ") + std::string(component_name(kAllComponents[i])) + " " +
               format_bytes(double(planned_i[i]));
    std::printf("%s%s\n", row.c_str(),
                c.num_experts > 0 ? " (dispatch: for the routing --plan-skew names, by default the worst)" : "");
  }
  // Every rank holds the same figures (all-reduced): one line, from rank 0.
  if (planned_total > budget && f.plan_check)
    throw AgreedError(over_budget(planned_i, planned_total, budget, s.set));
  check_machine_memory(f, s, plan, budget, *world);

  // Setup that can fail on one rank and not another (its device, its weights' shard):
  // agreed, so a failure is one line and the job ends without MPI_Abort.
  std::unique_ptr<Device> dev;
  agree(*world, [&] { dev = make_device(f.device, budget); });
  HostMemory host(MemoryLedger::kUnlimited, "host", dev->host_pages());
  world = device_communicator(*dev, std::move(world));
  ThreadPool pool(std::max(1, default_thread_count() / std::max(1, launcher_local_size())));
  ProcessGroups groups = ProcessGroups::split(*world, s.layout);
  std::optional<MoeTransformer> model_holder;
  agree(*world, [&] {
    model_holder.emplace(*dev, host, groups, c, s.schedules);
    if (model_is_path(f.model)) model_holder->load_hf(f.model);
    else model_holder->init_parameters(f.seed);
  });
  MoeTransformer& model = *model_holder;

  const std::int32_t ignore = s.schedules.vocab.ignore_index;
  std::unique_ptr<SequenceSource> source =
      !f.data.empty() ? token_file_source(f.data, f.seq_len, f.eval_fraction, c.vocab_size)
      : f.task == "kv" ? kv_retrieval_source(KvRetrievalTask::standard(c.vocab_size, f.seq_len, f.seed, f.symbols), ignore)
                       : copy_task_source(CopyTask{c.vocab_size, f.seq_len, f.symbols, f.seed}, ignore);
  TrainerOptions topt;
  topt.optimizer = s.optimizer;
  topt.optimizer_options.adam.lr = static_cast<float>(f.lr);
  topt.optimizer_options.adam.weight_decay = static_cast<float>(f.weight_decay);
  topt.optimizer_options.adam.max_grad_norm = static_cast<float>(f.max_grad_norm);
  topt.optimizer_options.adam.beta2 = 0.95f;
  topt.lr = LrSchedule{static_cast<float>(f.lr), static_cast<float>(f.min_lr), f.warmup, f.steps};
  topt.skip_nonfinite = f.on_nonfinite == "skip";
  Trainer trainer(model, host, pool, topt);
  if (lead) std::printf("data: %s\n", source->describe().c_str());

  // Resuming: the model, the optimizer and the data position of the checkpoint's step.
  RunState resumed;
  std::string last_saved;  // the newest complete checkpoint of this run (named when a step fails)
  if (!f.resume.empty()) {
    const std::string from = resolve_checkpoint(f.resume);
    last_saved = from;
    resumed = load_checkpoint(from, trainer);
    if (lead) std::printf("resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(resumed.step));
    // What this command changes (refusals were made before any step, in validate).
    const std::string changes = check_resume(read_checkpoint_manifest(from), record, to_json(c), f.seed);
    if (lead && !changes.empty()) std::printf("%s\n", changes.c_str());
    if (resumed.step >= f.steps) {
      if (lead)
        std::printf("the checkpoint is at step %lld, --steps is %lld: nothing to train\n",
                    static_cast<long long>(resumed.step), static_cast<long long>(f.steps));
      return 0;
    }
  }
  install_stop_signals();

  const std::int64_t B = f.batch, S = f.seq_len, M = f.accumulation;
  // Data parallel over the cp groups: the ranks of one hold the same sequences (each
  // computes its zigzag shard), so sequences are dealt by group, not by rank.
  const std::int64_t DP = W / s.layout.cp, drank = rank / s.layout.cp;
  // The data position: global training sequences read before this process's first step.
  const std::int64_t s0 = resumed.step, consumed0 = resumed.sequences_consumed, per_step = M * DP * B;
  // A model from a Hugging Face directory: its config.json goes into every checkpoint (export).
  std::string hf_config_text;
  if (model_is_path(f.model)) {
    const std::filesystem::path p(f.model);
    std::ifstream in(std::filesystem::is_directory(p) ? p / "config.json" : p, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    hf_config_text = text.str();
  }
  std::int64_t skipped = 0;  // steps skipped for a non-finite loss or gradient (--on-nonfinite skip)
  bench::Stopwatch save_clock;
  auto start_save = [&](std::int64_t step) {
    RunState st;
    st.step = step;
    st.sequences_consumed = consumed0 + (step - s0) * per_step;
    st.seed = f.seed;
    st.hf_config = hf_config_text;
    st.run = record;
    save_clock = bench::Stopwatch();
    writer->start(trainer, st, c, s.layout);
  };
  auto finish_save = [&] {
    const std::string where = writer->finish(*world);
    if (where.empty()) return;
    last_saved = where;
    if (lead) std::printf("\nsaved %s (%.2f s after its step, written while training)\n", where.c_str(), save_clock.seconds());
  };
  std::vector<std::vector<std::int32_t>> ids(static_cast<std::size_t>(M)), tgt(static_cast<std::size_t>(M));
  auto fill = [&](std::int64_t m, std::int64_t first, bool eval) {
    auto& in = ids[static_cast<std::size_t>(m)];
    auto& tg = tgt[static_cast<std::size_t>(m)];
    in.resize(static_cast<std::size_t>(B * S));
    tg.resize(static_cast<std::size_t>(B * S));
    for (std::int64_t b = 0; b < B; ++b) {
      if (eval) source->eval(first + b, in.data() + b * S, tg.data() + b * S);
      else source->train(first + b, in.data() + b * S, tg.data() + b * S);
    }
  };
  const std::int64_t eval_windows = std::min<std::int64_t>(f.eval_batches, source->eval_sequences() / (DP * B));
  auto evaluate = [&]() -> double {
    std::vector<MicroBatch> eb;
    std::vector<std::vector<std::int32_t>> ei, et;
    for (std::int64_t k = 0; k < eval_windows; ++k) {
      fill(0, (k * DP + drank) * B, true);
      ei.push_back(ids[0]);
      et.push_back(tgt[0]);
    }
    for (std::size_t k = 0; k < ei.size(); ++k) eb.push_back({ei[k].data(), et[k].data(), B, S});
    return trainer.evaluate(eb);
  };

  std::unique_ptr<MetricsWriter> metrics;
  if (lead && !f.metrics.empty()) metrics = std::make_unique<MetricsWriter>(f.metrics, !f.resume.empty());  // a resume continues the history
  // One line refreshed in place on a terminal; under mpirun the launcher hands every
  // rank a pseudo-terminal even when the job's output goes to a file, so plain lines.
  Progress progress(stdout, lead && !launched_by_mpi() && Progress::is_terminal(stdout));
  const double blind = source->blind_loss();
  if (lead && !std::isnan(blind))
    std::printf("a model blind to the context cannot beat %.4f nats on the scored tokens (unigram entropy)\n", blind);
  if (lead) std::fflush(stdout);  // the start-up lines reach a log (a file) before step 1's long work
  if (!f.memory_timeline.empty()) dev->arena().start_timeline(rank, W);
  // A signal between two micro-batches (Trainer::step's stop check): the step is abandoned
  // on every rank, so the state is that of the last complete step, which is saved (unless
  // it is already, or none completed) with its data position: the resume is exact.
  auto stopped_during_step = [&](const StepStats& st, std::int64_t step) {
    const std::int64_t done = step - 1;
    std::string tail = "no --save-dir, nothing saved";
    if (writer) {
      if (writer->pending()) finish_save();
      if (done > s0 && !(f.save_every > 0 && done % f.save_every == 0)) {
        start_save(done);
        finish_save();
      }
      tail = done > s0        ? "resume with --resume " + f.save_dir
             : f.resume.empty() ? std::string("no step completed, nothing saved")
                                : "resume with --resume " + f.resume;
    }
    if (lead) {
      std::printf("\nstopped by signal %lld during step %lld (its micro-batches discarded: %lld of %lld run); %s\n",
                  static_cast<long long>(st.stopped), static_cast<long long>(step),
                  static_cast<long long>(st.micro_batches_done), static_cast<long long>(M), tail.c_str());
      std::fflush(stdout);
    }
    return writer ? 0 : 130;
  };
  bench::Stopwatch clock;
  double first_loss = 0, last_loss = 0, tokens_seen = 0, train_seconds = 0;
  std::vector<double> step_seconds;  // per step (the JSON summary)
  std::optional<double> last_eval;
  for (std::int64_t step = s0 + 1; step <= f.steps; ++step) {
    std::vector<MicroBatch> micro;
    for (std::int64_t m = 0; m < M; ++m) {
      fill(m, consumed0 + (((step - 1 - s0) * M + m) * DP + drank) * B, false);
      micro.push_back({ids[static_cast<std::size_t>(m)].data(), tgt[static_cast<std::size_t>(m)].data(), B, S});
    }
    StepStats st;
    try {
      st = trainer.step(micro, [] { return static_cast<std::int64_t>(g_stop_signal); });
    } catch (const NonFinite& e) {
      // Every rank holds the same message: printed once, every rank exits 1, no abort.
      if (lead) {
        std::fprintf(stderr, "peakbound: error: %s; the run stops (lower --lr, or --on-nonfinite skip)%s\n", e.what(),
                     last_saved.empty() ? "" : ("; the last checkpoint is " + last_saved).c_str());
        std::fflush(stderr);
      }
      return 1;
    }
    if (st.stopped != 0) return stopped_during_step(st, step);
    if (st.skipped) {
      ++skipped;
      if (lead) std::printf("\nskipped: %s\n", st.nonfinite.c_str());
    }
    if (step == s0 + 1) first_loss = st.ce;  // the cross-entropy, as last_loss (the progress line adds the aux term)
    last_loss = st.ce;
    tokens_seen += static_cast<double>(st.inputs);
    train_seconds += st.seconds;
    step_seconds.push_back(st.seconds);
    std::optional<double> eval_loss;
    if (eval_windows > 0 && ((f.eval_every > 0 && step % f.eval_every == 0) || step == f.steps)) {
      eval_loss = evaluate();
      last_eval = eval_loss;
    }
    // A signal seen by any rank stops every rank after this step (one small all-reduce).
    // (and whether a checkpoint's files are still being written anywhere).
    std::int64_t vitals[3] = {static_cast<std::int64_t>(dev->arena().peak()), g_stop_signal,
                              writer && writer->writing() ? 1 : 0};
    world->all_reduce(vitals, 3, DType::i64, ReduceOp::max);
    const std::int64_t peak = vitals[0];
    if (writer && writer->pending() && vitals[2] == 0) finish_save();
    if (writer && ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps) && vitals[1] == 0)
      start_save(step);
    if (lead) {
      StepReport r;
      r.step = step;
      r.total_steps = f.steps;
      r.loss = st.loss;
      r.lr = st.lr;
      r.grad_norm = st.grad_norm;
      r.tokens_per_second = st.seconds > 0 ? static_cast<double>(st.inputs) / st.seconds : 0;
      r.device_peak_bytes = static_cast<std::uint64_t>(peak);
      r.elapsed_seconds = clock.seconds();
      r.eval_loss = eval_loss;
      if (progress_every(step, f.steps) || eval_loss) progress.update(r);
      if (metrics) {
        nlohmann::json j = step_json(r);
        j["ce"] = st.ce;
        j["aux"] = st.aux;
        j["scored_tokens"] = st.tokens;
        j["skipped"] = st.skipped;
        j["skipped_steps"] = skipped;
        metrics->write(j);
      }
    }
    if (vitals[1] != 0) {
      if (!writer) {
        if (lead)
          std::printf("\nstopped by signal %lld after step %lld; no --save-dir, nothing saved\n",
                      static_cast<long long>(vitals[1]), static_cast<long long>(step));
        return 130;
      }
      start_save(step);
      finish_save();
      if (lead)
        std::printf("stopped by signal %lld after step %lld; resume with --resume %s\n",
                    static_cast<long long>(vitals[1]), static_cast<long long>(step), f.save_dir.c_str());
      return 0;
    }
  }
  if (writer) finish_save();
  if (lead) progress.finish();
  if (!f.memory_timeline.empty()) {
    MemoryTimeline t = dev->arena().take_timeline();
    t.title = c.name + ", schedules " + s.set.str() + ", seq_len " + std::to_string(f.seq_len) + ", cp " +
              std::to_string(s.layout.cp) + ", rank " + std::to_string(rank) + "/" + std::to_string(W);
    t.meta = nlohmann::json{{"model", c.name}, {"schedules", s.set.str()}, {"seq_len", f.seq_len},
                            {"batch", f.batch}, {"cp", s.layout.cp}, {"ep", s.layout.ep}, {"ranks", W}}.dump();
    write_memory_timeline(memory_timeline_path(f.memory_timeline, rank, W), t);
  }

  // Measured beside planned, per component (the largest over ranks of each).
  std::vector<std::int64_t> measured(kNumComponents + 1);
  for (std::size_t i = 0; i < kNumComponents; ++i)
    measured[i] = static_cast<std::int64_t>(dev->arena().peak(kAllComponents[i]));
  measured[kNumComponents] = static_cast<std::int64_t>(dev->arena().peak());
  world->all_reduce(measured.data(), measured.size(), DType::i64, ReduceOp::max);
  // What was live at the largest rank's peak (the binding component is its largest):
  // that rank's breakdown, the others contributing zeros (ties: the lowest rank).
  std::int64_t key = measured[kNumComponents] == static_cast<std::int64_t>(dev->arena().peak()) ? W - rank : 0;
  world->all_reduce(&key, 1, DType::i64, ReduceOp::max);
  std::vector<std::int64_t> at_peak(kNumComponents, 0);
  if (key == W - rank) {
    const ComponentBytes b = dev->arena().peak_breakdown();
    for (std::size_t i = 0; i < kNumComponents; ++i) at_peak[i] = static_cast<std::int64_t>(b[i]);
  }
  world->all_reduce(at_peak.data(), at_peak.size(), DType::i64, ReduceOp::sum);
  if (!lead) return 0;
  const double tps = train_seconds > 0 ? tokens_seen / train_seconds : 0;
  std::printf("\n%-12s %14s %14s\n", "component", "planned", "measured");
  nlohmann::json table = nlohmann::json::object();
  for (std::size_t i = 0; i <= kNumComponents; ++i) {
    if (i < kNumComponents && planned_i[i] == 0 && measured[i] == 0) continue;
    const std::string name = i < kNumComponents ? std::string(component_name(kAllComponents[i])) : "total";
    std::printf("%-12s %14s %14s\n", name.c_str(), pad(format_bytes(double(planned_i[i])), 14).c_str(),
                pad(format_bytes(double(measured[i])), 14).c_str());
    table[name] = {{"planned_bytes", planned_i[i]}, {"measured_bytes", measured[i]}};
    if (i < kNumComponents) table[name]["at_peak_bytes"] = at_peak[i];
  }
  std::printf("\nloss %.4f -> %.4f (cross-entropy on the scored tokens)", first_loss, last_loss);
  if (last_eval) std::printf(", held-out %.4f", *last_eval);
  if (!std::isnan(blind)) std::printf(", context-blind bound %.4f", blind);
  std::printf("; %.0f tokens/s over %lld steps", tps, static_cast<long long>(f.steps - s0));
  if (skipped > 0) std::printf(" (%lld skipped: non-finite)", static_cast<long long>(skipped));
  std::printf("\n");
  if (f.json) {
    nlohmann::json j = {{"model", c.name},
                        {"ranks", W},
                        {"cp", s.layout.cp},
                        {"schedules", s.set.str()},
                        {"steps", f.steps},
                        {"first_loss", first_loss},
                        {"final_loss", last_loss},
                        {"tokens_per_second", tps},
                        {"inputs_per_step", W / s.layout.cp * B * S * M},
                        {"step_seconds", step_seconds},
                        {"budget_bytes", budget},
                        {"peaks", table}};
    if (last_eval) j["eval_loss"] = *last_eval;
    if (!std::isnan(blind)) j["blind_loss"] = blind;
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

Command add_train(CLI::App& parent) {
  auto f = std::make_shared<TrainFlags>();
  Command cmd;
  cmd.collective = true;
  CLI::App* app = parent.add_subcommand(
      "train", "Train a Mixture-of-Experts model with the four peak-bounding schedules (over mpirun ranks)");
  cmd.app = app;
  text_flag(app, "--model", f->model, "A preset name (see `peakbound info`) or a Hugging Face directory")
      ->capture_default_str();
  text_flag(app, "--data", f->data, "A token file (llm.c / nanoGPT format); default: the built-in task");
  text_flag(app, "--task", f->task, "The built-in task: copy (a random segment, then itself) or kv (key-value retrieval)")
      ->capture_default_str();
  real_flag(app, "--eval-fraction", f->eval_fraction, "Held-out fraction of a token file", 1e-6, 0.5);
  int_flag(app, "--symbols", f->symbols, "Built-in task: distinct symbols (copy) or keys and values (kv); 0 = the whole vocabulary", 0,
           std::int64_t{1} << 30);
  int_flag(app, "--seq-len", f->seq_len, "Tokens per sequence", 8, std::int64_t{1} << 24);
  int_flag(app, "--batch", f->batch, "Sequences per data-parallel rank (per --cp group) per micro-batch", 1, 1 << 20);
  int_flag(app, "--accumulation", f->accumulation, "Micro-batches per step (gradient accumulation)", 1, 1 << 20);
  int_flag(app, "--steps", f->steps, "Optimizer steps", 1, std::int64_t{1} << 40);
  real_flag(app, "--lr", f->lr, "Peak learning rate", 0.0, 10.0);
  real_flag(app, "--min-lr", f->min_lr, "Learning rate at the end of the cosine decay", 0.0, 10.0);
  int_flag(app, "--warmup", f->warmup, "Linear warm-up steps", 0, std::int64_t{1} << 40);
  real_flag(app, "--weight-decay", f->weight_decay, "AdamW weight decay", 0.0, 10.0);
  real_flag(app, "--max-grad-norm", f->max_grad_norm, "Global gradient-norm clipping (0 = off)", 0.0, 1e9);
  seed_flag(app, "--seed", f->seed, "Seed of the initialisation and the task");
  text_flag(app, "--schedules", f->schedules, "all, none, or a list of llep,dtp,sco,adam")->capture_default_str();
  int_flag(app, "--ep", f->ep, "Expert-parallel size (0 = the largest that divides ranks and experts)", 0, 1 << 24);
  int_flag(app, "--vocab-group", f->vocab_group, "Ranks sharing the LM head by vocabulary (0 = all)", 0, 1 << 24);
  int_flag(app, "--cp", f->cp, "Context-parallel size: consecutive ranks splitting every sequence (ring attention)", 1,
           1 << 24);
  device_flag(app, f->device);
  text_flag(app, "--device-memory", f->device_memory, "Device budget per rank (auto = the plan plus headroom)")
      ->capture_default_str();
  int_flag(app, "--eval-every", f->eval_every, "Held-out loss every N steps (0 = at the end only)", 0,
           std::int64_t{1} << 40);
  int_flag(app, "--eval-batches", f->eval_batches, "Held-out micro-batches per evaluation (0 = no evaluation)", 0,
           1 << 20);
  text_flag(app, "--metrics", f->metrics, "Write one JSON object per step to this file (JSONL)");
  app->add_flag("--json", f->json, "Print a JSON summary at the end");
  app->add_flag("!--no-plan-check", f->plan_check,
                "Start even when the plan exceeds --device-memory: the device's arena refuses what does not fit "
                "(what `bench reach` uses to find the largest context by real steps)");
  real_flag(app, "--plan-skew", f->plan_skew,
            "Routing imbalance the plan reserves dispatch memory for (busiest rank's load over the mean; 0 = the "
            "worst the layout allows)",
            0.0, 1e9);
  text_flag(app, "--save-dir", f->save_dir,
            "Write checkpoints here (step-N folders, a `latest` pointer): every --save-every steps, at the end, and "
            "on SIGINT/SIGTERM");
  int_flag(app, "--save-every", f->save_every, "Checkpoint every N steps (0 = at the end only)", 0,
           std::int64_t{1} << 40);
  int_flag(app, "--keep", f->keep, "Checkpoints kept in --save-dir (the newest)", 1, 1 << 20);
  text_flag(app, "--resume", f->resume,
            "Continue from the latest checkpoint in this folder (or a step folder); --steps stays the run's total");
  text_flag(app, "--on-nonfinite", f->on_nonfinite,
            "A non-finite loss or gradient: stop (name the step and the tensor; the last checkpoint stays) or skip "
            "the step's update")
      ->capture_default_str();
  text_flag(app, "--memory-timeline", f->memory_timeline,
            "Record every device allocation and release (time, component, bytes, phase) and write them as JSON "
            "for `peakbound plot-memory`: this file on one rank, else one per rank with .rank-R before the "
            "extension (t.json -> t.rank-0.json)");
  add_config_flag(app);
  cmd.validate = [f, app] {
    if (!f->data.empty() && app->get_option("--task")->count() > 0)
      throw InvalidArgument("--task " + f->task + " and --data " + f->data +
                            ": a run trains on the built-in task or on the token file, not both; drop one");
    if (f->on_nonfinite != "stop" && f->on_nonfinite != "skip")
      throw InvalidArgument("--on-nonfinite must be stop or skip, got '" + f->on_nonfinite + "'");
    if (f->plan_skew > 0 && f->plan_skew < 1) throw InvalidArgument("--plan-skew must be 0 (worst case) or >= 1");
    if (f->min_lr > f->lr) throw InvalidArgument("--min-lr " + std::to_string(f->min_lr) + " exceeds --lr");
    // The paths first (cli/command_paths.h): no output over an input, no FIFO or device.
    check_command_paths(app, {.inputs = {{"--data", f->data}}, .model = f->model, .checkpoint = f->resume,
                              .outputs = {{"--metrics", f->metrics}}, .memory_timeline = f->memory_timeline,
                              .world = launcher_size()});
    const Setup s = make_setup(*f, launcher_size());
    // Every rank reads the same file: a bad one is one line from rank 0, not one per rank.
    if (!f->data.empty()) (void)token_file_source(f->data, f->seq_len, f->eval_fraction, s.config.vocab_size);
    if (f->device_memory != "auto") (void)parse_bytes(f->device_memory, "--device-memory");
    // A resume that changes what defines the run is refused (cli/train_resume.h).
    if (!f->resume.empty())
      (void)check_resume(read_checkpoint_manifest(resolve_checkpoint(f->resume)), run_record(*f, s, launcher_size()),
                         to_json(s.config), f->seed);
    if (f->save_every > 0 && f->save_dir.empty()) throw InvalidArgument("--save-every needs --save-dir");
    // Last (it creates the folder): found before step 1, not at the first save.
    if (!f->save_dir.empty()) prepare_save_folder(f->save_dir);
  };
  cmd.run = [f] { return run_train(*f); };
  return cmd;
}

const bool registered = register_command("", "train", add_train);

}  // namespace

}  // namespace peakbound::cli
