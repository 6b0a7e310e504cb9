#include "peakbound/train/run.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "peakbound/comm/agree.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/launcher.h"
#include "peakbound/core/stopwatch.h"
#include "peakbound/core/system_memory.h"
#include "peakbound/core/units.h"
#include "peakbound/io/memory_timeline_file.h"
#include "peakbound/layers/moe_layer.h"
#include "peakbound/model/describe.h"
#include "peakbound/model/model_flops.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/gemm_rate.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/schedules/ulysses_attention.h"
#include "peakbound/train/copy_task.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/model_spec.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/run_resume.h"
#include "peakbound/train/sequence_source.h"

namespace peakbound {

std::string field_spelling(std::string_view field) { return std::string(field); }

std::string flag_spelling(std::string_view field) {
  std::string s = "--" + std::string(field);
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char small[512];
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  const int n = std::vsnprintf(small, sizeof small, fmt, a);
  va_end(a);
  std::string s;
  if (n < static_cast<int>(sizeof small)) {
    s = small;
  } else {
    s.resize(static_cast<std::size_t>(n) + 1);
    std::vsnprintf(s.data(), s.size(), fmt, b);
    s.resize(static_cast<std::size_t>(n));
  }
  va_end(b);
  return s;
}

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.insert(0, w - s.size(), ' ');
  return s;
}

// The run's record in its checkpoints (RunState.run): what defines it and what a resume
// may change (train/run_resume.h).
nlohmann::json run_record(const RunSettings& f, const RunShape& s, std::int64_t world) {
  return {{"model", f.model}, {"precision", precision_name(f.precision)}, {"schedules", f.schedules.str()}, {"seq_len", f.seq_len}, {"batch", f.batch},
          {"accumulation", f.accumulation}, {"steps", f.steps}, {"lr", f.lr}, {"cp", s.layout.cp},
          {"ep", s.layout.ep}, {"vocab_group", s.layout.vocab}, {"ranks", world},
          {"data", f.data.empty() ? nlohmann::json(nullptr) : data_identity(f.data)},
          {"task", f.data.empty() ? nlohmann::json(f.task_name()) : nlohmann::json(nullptr)}, {"symbols", f.symbols},
          {"seed", f.seed}, {"save_every", f.save_every}, {"eval_every", f.eval_every}};
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
    const ScheduleInfo* b = ScheduleSet::bounding(c);  // the schedule that bounds c, when it is off
    const std::string sched = b != nullptr && !(on.*(b->on)) ? std::string(b->name) : std::string();
    parts += std::string(k ? ", " : "") + std::string(component_name(c)) + " " +
             format_bytes(static_cast<double>(planned[order[k]])) + (sched.empty() ? "" : " (bounded by " + sched + ")");
    if (!sched.empty()) fixes += std::string(fixes.empty() ? "" : ",") + sched;
  }
  return "the plan needs " + format_bytes(static_cast<double>(total)) + " per device, over the " +
         format_bytes(static_cast<double>(budget)) + " budget; largest: " + parts + "; fix: " +
         (fixes.empty() ? std::string("") : "add " + fixes + " to --schedules, or ") +
         "shorten --seq-len or --batch, or raise --device-memory";
}

// The plan against the machine's memory (core/system_memory.h), before anything large is
// allocated: on the CPU device the arena's budget is RAM; on every device the host side
// (the footprint's host peak: offloaded optimizer state and boundaries, staging; the
// batches' token arrays; with a save_dir the checkpoint's copy of the optimizer state).
// The ranks on this machine each plan as much as the largest rank.
void check_machine_memory(const RunSettings& f, const Footprint& plan, std::uint64_t budget, Communicator& world) {
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
  if (!f.schedules.every()) fix += ", turn on more --schedules";
  fix += ", or spread the run over more machines (more ranks, fewer per machine)";
  // Machines may differ (several nodes): one line, from the lowest rank whose machine is short.
  agree(world, [&] { check_fits_machine(need, machine_memory(), fix); });
}

// Plain progress lines: about 20 per run, and the first and the last step.
bool progress_every(std::int64_t step, std::int64_t steps) {
  const std::int64_t every = std::max<std::int64_t>(1, steps / 20);
  return step == 1 || step == steps || step % every == 0;
}

std::unique_ptr<Device> agreed_device(Communicator& world, const std::string& kind, std::uint64_t budget) {
  std::unique_ptr<Device> dev;
  agree(world, [&] { dev = make_device(kind, budget); });
  return dev;
}

}  // namespace

ModelSchedules model_schedules(const ScheduleSet& set, Precision precision) {
  ModelSchedules m;
  m.precision = precision;
  m.dispatch = set.dispatch();
  m.ring_dtp = set.ring_dtp();
  m.checkpoint.schedule = set.checkpoint();
  m.moe_tile = default_moe_tile(m.dispatch);
  return m;
}

int cpu_attention_threads(int world) {
  const int local = launcher_local_size() > 1 ? launcher_local_size() : world;
  return ops::host_cores_per_rank(local);
}

bool ulysses_context_attention(const std::string& value, const std::string& spelled) {
  if (value != "ring" && value != "ulysses")
    throw InvalidArgument(spelled + " must be ring or ulysses, got '" + value + "'");
  return value == "ulysses";
}

bool latent_cp_ring(const std::string& value, const std::string& spelled) {
  if (value != "latent" && value != "kv")
    throw InvalidArgument(spelled + " must be latent or kv, got '" + value + "'");
  return value == "latent";
}

RunShape resolve_run(const RunSettings& f, int world, SettingSpelling spell) {
  RunShape s;
  s.config = load_model_spec(f.model);
  s.config.seq_aux_loss_coef = f.seq_aux_coef;
  s.config.mla_latent_ring = latent_cp_ring(f.cp_ring, spell("cp_ring"));
  s.config.ulysses_attention = ulysses_context_attention(f.context_attention, spell("context_attention"));
  check_trainable(s.config);
  s.schedules = model_schedules(f.schedules, f.precision);
  if (f.device == "cpu") s.schedules.attention_threads = cpu_attention_threads(world);
  // By the budget: kept where the stack keeps a boundary per layer (a group's
  // recomputation runs its attention anyway); Run drops it when the plan does not fit.
  s.schedules.keep_attention = f.keep_attention > 0 || (f.keep_attention < 0 && f.checkpoint_group == 1);
  // By the budget too: Run drops them when the plan does not fit.
  s.schedules.vocab.keep_logits = f.keep_logits != 0;
  s.schedules.keep_experts = f.keep_experts != 0;
  if (f.moe_tile >= 0) s.schedules.moe_tile = f.moe_tile;
  if (f.prefetch_depth >= 0) s.schedules.checkpoint.prefetch_depth = f.prefetch_depth;
  s.schedules.checkpoint.group_layers = f.checkpoint_group;
  if (f.embedding != "auto" && f.embedding != "fsdp" && f.embedding != "vocab")
    throw InvalidArgument(spell("embedding") + " must be auto, fsdp or vocab, got '" + f.embedding + "'");
  // auto: the vocabulary-parallel one where it can run (Run drops it when the plan does
  // not fit with it).
  s.schedules.vocab_parallel_embedding =
      f.embedding == "vocab" || (f.embedding == "auto" && f.device == "cpu" && f.schedules.any());
  if (f.checkpoint_group > s.config.num_layers)
    throw InvalidArgument(spell("checkpoint_group") + " must be at most the model's " +
                          std::to_string(s.config.num_layers) + " layers, got " + std::to_string(f.checkpoint_group));
  if (f.keep_attention > 0 && f.checkpoint_group > 1)
    throw InvalidArgument(spell("keep_attention") + " does not combine with " + spell("checkpoint_group") + " " +
                          std::to_string(f.checkpoint_group) +
                          ": a group's recomputation runs its layers' attention again; choose one");
  s.layout = resolve_layout(f.ep, f.vocab_group, f.cp, s.config, world);
  check_context_split(f.cp, f.seq_len, spell("seq_len"));
  if (s.config.ulysses_attention && s.layout.cp > 1)
    if (const std::string why = ulysses_refusal(s.config.num_heads, s.config.num_kv_heads, s.layout.cp,
                                                s.config.attention == AttentionKind::mla);
        !why.empty())
      throw InvalidArgument(spell("context_attention") + " ulysses: " + why + "; use ring");
  return s;
}

void RunSettings::validate(int world, SettingSpelling spell) const {
  const auto bad = [&](std::string_view field, const std::string& rest) {
    throw InvalidArgument(spell(field) + " " + rest);
  };
  // The values (the CLI's flags check their ranges as they parse; a library user's here).
  if (seq_len < 8) bad("seq_len", "must be at least 8, got " + std::to_string(seq_len));
  if (batch < 1) bad("batch", "must be at least 1, got " + std::to_string(batch));
  if (accumulation < 1) bad("accumulation", "must be at least 1, got " + std::to_string(accumulation));
  if (steps < 1) bad("steps", "must be at least 1, got " + std::to_string(steps));
  if (moe_tile < -1) bad("moe_tile", "must be -1 (the schedules' choice), 0 (whole) or a row count, got " +
                                         std::to_string(moe_tile));
  if (keep_attention < -1 || keep_attention > 1)
    bad("keep_attention", "must be -1 (the budget's choice), 0 or 1, got " + std::to_string(keep_attention));
  if (keep_logits < -1 || keep_logits > 1)
    bad("keep_logits", "must be -1 (the budget's choice), 0 or 1, got " + std::to_string(keep_logits));
  if (keep_experts < -1 || keep_experts > 1)
    bad("keep_experts", "must be -1 (the budget's choice), 0 or 1, got " + std::to_string(keep_experts));
  if (prefetch_depth < -1) bad("prefetch_depth", "must be -1 (the budget's choice) or a depth >= 0, got " +
                                                     std::to_string(prefetch_depth));
  if (checkpoint_group < 1) bad("checkpoint_group", "must be at least 1, got " + std::to_string(checkpoint_group));
  if (warmup < 0) bad("warmup", "must be at least 0, got " + std::to_string(warmup));
  if (symbols < 0) bad("symbols", "must be at least 0, got " + std::to_string(symbols));
  if (eval_every < 0) bad("eval_every", "must be at least 0, got " + std::to_string(eval_every));
  if (eval_batches < 0) bad("eval_batches", "must be at least 0, got " + std::to_string(eval_batches));
  if (save_every < 0) bad("save_every", "must be at least 0, got " + std::to_string(save_every));
  if (keep < 1) bad("keep", "must be at least 1, got " + std::to_string(keep));
  if (!(eval_fraction > 0 && eval_fraction <= 0.5)) bad("eval_fraction", "must be in (0, 0.5]");
  if (!(lr >= 0) || !(min_lr >= 0)) bad(lr >= 0 ? "min_lr" : "lr", "must be at least 0");
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2", "must be in [0, 1)");
  if (!(weight_decay >= 0) || !(max_grad_norm >= 0)) bad(weight_decay >= 0 ? "max_grad_norm" : "weight_decay", "must be at least 0");
  if (!(bias_update_speed >= 0 && bias_update_speed <= 1)) bad("bias_update_speed", "must be in [0, 1]");
  if (!(seq_aux_coef >= 0 && seq_aux_coef <= 1)) bad("seq_aux_coef", "must be in [0, 1]");
  if (!data.empty() && !task.empty())
    throw InvalidArgument(spell("task") + " " + task + " and " + spell("data") + " " + data +
                          ": a run trains on the built-in task or on the token file, not both; drop one");
  if (!(gemm_peak >= 0 && gemm_peak <= 1e19)) bad("gemm_peak", "must be a rate in FLOP/s >= 0");
  if (gemm_peak > 0 && measure_gemm_peak)
    throw InvalidArgument(spell("gemm_peak") + " and " + spell("measure_gemm_peak") +
                          ": the MFU is against one peak, given or measured; drop one");
  latent_cp_ring(cp_ring, spell("cp_ring"));
  if (on_nonfinite != "stop" && on_nonfinite != "skip")
    bad("on_nonfinite", "must be stop or skip, got '" + on_nonfinite + "'");
  if (plan_skew < 0 || (plan_skew > 0 && plan_skew < 1)) bad("plan_skew", "must be 0 (worst case) or >= 1");
  if (min_lr > lr) throw InvalidArgument(spell("min_lr") + " " + std::to_string(min_lr) + " exceeds " + spell("lr"));
  // The model, the layout and the task.
  const RunShape s = resolve_run(*this, world, spell);
  if (data.empty()) {
    if (task_name() == "kv") KvRetrievalTask::standard(s.config.vocab_size, seq_len, seed, symbols).validate();
    else if (task_name() == "copy") CopyTask{s.config.vocab_size, seq_len, symbols, seed}.validate();
    else if (task_name() != "random") bad("task", "must be copy, kv or random, got '" + task + "'");
  } else {
    // Every rank reads the same file: a bad one is one line from rank 0, not one per rank.
    (void)token_file_source(data, seq_len, eval_fraction, s.config.vocab_size);
  }
  if (device_memory != "auto") (void)parse_bytes(device_memory, spell("device_memory"));
  // A resume that changes what defines the run is refused (train/run_resume.h).
  if (!resume.empty())
    (void)check_resume(read_checkpoint_manifest(resolve_checkpoint(resume)), run_record(*this, s, world),
                       to_json(s.config), seed);
  if (save_every > 0 && save_dir.empty()) throw InvalidArgument(spell("save_every") + " needs " + spell("save_dir"));
  // Last (it creates the folder): found before step 1, not at the first save.
  if (!save_dir.empty()) prepare_save_folder(save_dir);
}

namespace {

// OffloadStreamAdamW on the CPU device updates the shard where it lies: the device's
// memory is the host's, so staging it through host slots would only copy it twice. Not
// under PEAKBOUND_STRICT_DEVICE=1, where the CPU device plays a GPU to host code.
bool in_place_optimizer(const RunSettings& f) { return f.device == "cpu" && !strict_device_memory(); }

}  // namespace

TrainFootprintInputs run_footprint_inputs(const RunSettings& f, const RunShape& s, int world, int rank) {
  TrainFootprintInputs in;
  in.model = s.config;
  in.layout = s.layout;
  in.world = world;
  in.rank = rank;
  in.sequences = f.batch;
  in.seq_len = f.seq_len;
  in.schedules = s.schedules;
  in.optimizer = std::string(f.schedules.optimizer());
  in.optimizer_options.in_place = in_place_optimizer(f);
  in.evaluates = f.eval_batches > 0;  // the held-out loss's forward is a moment of the run too
  // The dispatch's memory depends on the routing, which the run decides: the plan
  // reserves for the skew given, by default the worst (every token-copy to one rank).
  in.skew = f.plan_skew > 0 ? std::min(f.plan_skew, static_cast<double>(s.layout.ep))
                            : static_cast<double>(s.layout.ep);
  return in;
}

RunModel::RunModel(std::unique_ptr<Communicator> world_in, const std::string& kind, std::uint64_t budget,
                   const std::string& model_spec, const ModelConfig& config, const ParallelLayout& layout,
                   const ModelSchedules& schedules, std::uint64_t seed)
    : device(agreed_device(*world_in, kind, budget)),
      host(MemoryLedger::kUnlimited, "host", device->host_pages()),
      world(device_communicator(*device, std::move(world_in))),
      pool(ops::host_cores_per_rank(launcher_local_size())),
      groups(ProcessGroups::split(*world, layout)) {
  // Setup that can fail on one rank and not another (its weights' shard): agreed.
  agree(*world, [&] {
    model.emplace(*device, host, groups, config, schedules);
    if (model_is_path(model_spec)) model->load_hf(model_spec);
    else model->init_parameters(seed);
  });
}

RunModel::~RunModel() = default;

struct Run::State {
  RunSettings f;
  RunPrinter print;
  StopCheck stop;
  int W = 1, rank = 0;
  bool lead = true;
  RunShape shape;
  nlohmann::json record;
  std::optional<CheckpointWriter> writer;
  std::vector<std::int64_t> planned;  // per component, then the total: largest over ranks
  std::uint64_t budget = 0;
  std::unique_ptr<RunModel> m;
  std::unique_ptr<SequenceSource> source;
  std::optional<Trainer> trainer;
  std::string last_saved;  // the newest complete checkpoint of this run (named when a step fails)
  std::int64_t B = 1, S = 1, M = 1, DP = 1, drank = 0;
  std::int64_t s0 = 0, consumed0 = 0, per_step = 0, step = 0;  // step: the last complete one
  std::int64_t eval_windows = 0, skipped = 0;
  std::string hf_config_text;  // a Hugging Face model's config.json, in every checkpoint (export)
  std::vector<std::vector<std::int32_t>> ids, tgt;
  std::unique_ptr<MetricsWriter> metrics;
  Stopwatch clock, save_clock;
  double first_loss = 0, last_loss = 0, tokens_seen = 0, scored_seen = 0, train_seconds = 0, blind = 0;
  std::vector<double> step_seconds;
  std::uint64_t ring_bytes = 0;  // this rank's context-parallel ring attention sends in the steps taken
  PhaseSeconds phases{};         // this rank's step time by phase, summed over the steps taken
  double communication = 0;      // this rank's exposed communication, summed over the steps taken
  std::optional<double> last_eval;
  bool nothing_to_train = false;

  void say(const std::string& text) const {
    if (lead && print) print(text);
  }
  void fill(std::int64_t m, std::int64_t first, bool eval) {
    auto& in = ids[static_cast<std::size_t>(m)];
    auto& tg = tgt[static_cast<std::size_t>(m)];
    in.resize(static_cast<std::size_t>(B * S));
    tg.resize(static_cast<std::size_t>(B * S));
    for (std::int64_t b = 0; b < B; ++b) {
      if (eval) source->eval(first + b, in.data() + b * S, tg.data() + b * S);
      else source->train(first + b, in.data() + b * S, tg.data() + b * S);
    }
  }
  // Saves overlap training: the state is copied at the step, the files are written by a
  // thread, and the checkpoint is committed at the first step boundary where every rank's
  // files are written (or at once when the run stops).
  void start_save(std::int64_t at) {
    RunState st;
    st.step = at;
    st.sequences_consumed = consumed0 + (at - s0) * per_step;
    st.seed = f.seed;
    st.hf_config = hf_config_text;
    st.run = record;
    save_clock = Stopwatch();
    writer->start(*trainer, st, shape.config, shape.layout);
  }
  // save_dir's writer: the folder becomes this run's (its lock, its identity;
  // run_checkpoint.h) before anything is written. A resumed run is the run its checkpoint
  // names; a checkpoint from before run ids makes the folder it was resumed from this
  // run's. Collective.
  void open_writer(Communicator& world) {
    writer.emplace(f.save_dir, SaveOptions{f.keep});
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
    writer->claim(world, id, record, adopt);
    if (!writer->locked())
      say(format("note: %s is on a file system without locks: a second run on it is not detected while this one "
                 "runs\n", f.save_dir.c_str()));
  }
  void finish_save() {
    const std::string where = writer->finish(*m->world);
    if (where.empty()) return;
    last_saved = where;
    say(format("\nsaved %s (%.2f s after its step, written while training)\n", where.c_str(), save_clock.seconds()));
  }
};

Run::Run(const RunSettings& settings, RunPrinter print, StopCheck stop) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.f = settings;
  s.print = std::move(print);
  s.stop = stop ? std::move(stop) : StopCheck([] { return std::int64_t{0}; });
  const RunSettings& f = s.f;
  ops::share_host_cores_among_local_ranks();
  auto world = world_communicator();
  s.W = world->size();
  s.rank = world->rank();
  s.lead = s.rank == 0;
  s.shape = resolve_run(f, s.W);
  const ModelConfig& c = s.shape.config;
  s.record = run_record(f, s.shape, s.W);
  if (!f.save_dir.empty()) s.open_writer(*world);

  // The plan: this rank's footprint, the largest over ranks (vocabulary shards differ).
  auto plan_of = [&](const RunShape& shape, std::vector<std::int64_t>& out) {
    Footprint fp = train_footprint(run_footprint_inputs(f, shape, s.W, s.rank));
    const ComponentBytes peak = fp.device_peak();
    out.assign(kNumComponents + 1, 0);
    for (std::size_t i = 0; i < kNumComponents; ++i) out[i] = static_cast<std::int64_t>(peak[i]);
    out[kNumComponents] = static_cast<std::int64_t>(fp.device_peak_total());
    world->all_reduce(out.data(), out.size(), DType::i64, ReduceOp::max);
    return fp;
  };
  Footprint plan = plan_of(s.shape, s.planned);
  // The plan made again with `change` to the schedules, and taken where `take` (given the
  // new plan's figures) says so.
  const auto plan_again = [&](auto change, auto take) {
    RunShape next = s.shape;
    change(next.schedules);
    std::vector<std::int64_t> planned_next;
    Footprint plan_next = plan_of(next, planned_next);
    if (!take(planned_next)) return;
    s.shape = std::move(next);
    s.planned = std::move(planned_next);
    plan = std::move(plan_next);
  };
  const auto drop_logits = [](ModelSchedules& m) { m.vocab.keep_logits = false; };
  const auto drop_experts = [](ModelSchedules& m) { m.keep_experts = false; };
  const auto lower_peak = [&](const std::vector<std::int64_t>& lean) {
    return lean[kNumComponents] < s.planned[kNumComponents];
  };
  // The same rule for the kept experts: every MoE layer's at once, ~ T x top_k x (3F + H)
  // activations a layer.
  if (f.device_memory == "auto" && f.keep_experts < 0 && s.shape.schedules.keep_experts)
    plan_again(drop_experts, lower_peak);
  // --device-memory auto names no memory to spend on speed: there the logits are kept (by
  // the budget) only where they leave the plan's peak where it is. Kept, they are
  // [the group's tokens, V/P] fp32, at 2 ranks x 4096 tokens of tiny-moe 120 -> 380 MB.
  if (f.device_memory == "auto" && f.keep_logits < 0 && s.shape.schedules.vocab.keep_logits)
    plan_again(drop_logits, lower_peak);
  s.budget = f.device_memory == "auto" ? auto_device_budget(static_cast<std::uint64_t>(s.planned[kNumComponents]))
                                       : parse_bytes(f.device_memory, "--device-memory");
  // The choices the budget makes, each dropped in turn while the plan does not fit it: the
  // plan is made again without it, and a line says what keeping it needed. Every rank
  // decides on the same all-reduced figures.
  const auto over_budget_now = [&] { return static_cast<std::uint64_t>(s.planned[kNumComponents]) > s.budget; };
  std::string fallback_notes;
  const auto fall_back = [&](auto change, const std::string& note) {
    fallback_notes += note + format_bytes(double(s.planned[kNumComponents])) + "\n";
    plan_again(change, [](const std::vector<std::int64_t>&) { return true; });
  };
  // The vocabulary-parallel embedding (--embedding auto): while the plan fits with it.
  if (f.embedding == "auto" && s.shape.schedules.vocab_parallel_embedding && over_budget_now())
    fall_back([](ModelSchedules& m) { m.vocab_parallel_embedding = false; },
              "the embedding is an FSDP unit (--embedding auto): sharded over the vocabulary group the plan needs ");
  // The experts kept (--keep-experts not given): while the plan fits with them, dropped
  // first (every MoE layer's rows at once: the largest per-token term a choice adds).
  if (f.keep_experts < 0 && s.shape.schedules.keep_experts && over_budget_now())
    fall_back(drop_experts,
              "the experts compute their forward again in the backward (--keep-experts by the budget): keeping it "
              "the plan needs ");
  // The logits kept (--keep-logits not given): while the plan fits with them, dropped
  // before the attention (the largest per-token term a budget's choice adds, for the
  // smaller gain).
  if (f.keep_logits < 0 && s.shape.schedules.vocab.keep_logits && over_budget_now())
    fall_back(drop_logits,
              "the vocabulary loss computes its logits again in the backward (--keep-logits by the budget): keeping "
              "them the plan needs ");
  // The attention kept (--keep-attention not given): while the plan fits with it; where
  // it does not, the backward recomputes each layer's attention (before the ring below,
  // which is cut only if that still does not fit).
  if (f.keep_attention < 0 && s.shape.schedules.keep_attention && over_budget_now())
    fall_back([](ModelSchedules& m) { m.keep_attention = false; },
              "the backward recomputes each layer's attention (--keep-attention by the budget): keeping it the plan "
              "needs ");
  // SCO's ring (--prefetch-depth -1): two slots, each copy hidden behind a block's
  // compute, while the plan fits with them; one slot (the blocks in place in it, every
  // copy waited for) when it does not.
  if (f.prefetch_depth < 0 && s.shape.schedules.checkpoint.schedule == CheckpointSchedule::sco &&
      s.shape.schedules.checkpoint.prefetch_depth > 0 && over_budget_now())
    fall_back([](ModelSchedules& m) { m.checkpoint.prefetch_depth = 0; },
              "SCO's ring holds one boundary (prefetch depth 0, its copies waited for; the slot and the final hidden "
              "on the host across the loss, the attention output on it between its readers where the queries go in "
              "pieces): with two the plan needs ");
  const std::uint64_t planned_total = static_cast<std::uint64_t>(s.planned[kNumComponents]);
  std::string text = format(
      "peakbound train: %s (%s), %lld parameters, %d ranks (cp %lld, ep %lld, vocab group %lld), schedules %s, "
      "precision %s\n",
      c.name.c_str(), c.family.c_str(), static_cast<long long>(TensorTable(c).total_numel()), s.W,
      static_cast<long long>(s.shape.layout.cp), static_cast<long long>(s.shape.layout.ep),
      static_cast<long long>(s.shape.layout.vocab), f.schedules.str().c_str(),
      std::string(precision_name(f.precision)).c_str());
  text += format("plan (per device, from the footprints): peak %s of %s budget\n",
                 format_bytes(double(planned_total)).c_str(), format_bytes(double(s.budget)).c_str());
  std::string row;
  for (std::size_t i = 0; i < kNumComponents; ++i)
    if (s.planned[i] > 0)
      row += std::string(row.empty() ? "  " : ", ") + std::string(component_name(kAllComponents[i])) + " " +
             format_bytes(double(s.planned[i]));
  text += row + (c.num_experts > 0 ? " (dispatch: for the routing --plan-skew names, by default the worst)" : "") + "\n";
  text += fallback_notes;
  if (c.num_mtp_layers > 0)
    text += format("note: the model's %lld multi-token-prediction layer(s) (model.layers.%lld and on in its checkpoint) "
                   "are not trained: transformers does not load them either\n",
                   static_cast<long long>(c.num_mtp_layers), static_cast<long long>(c.num_layers));
  s.say(text);
  // Every rank holds the same figures (all-reduced): one line, from rank 0.
  if (planned_total > s.budget && f.plan_check) throw AgreedError(over_budget(s.planned, planned_total, s.budget, f.schedules));
  check_machine_memory(f, plan, s.budget, *world);

  s.m = std::make_unique<RunModel>(std::move(world), f.device, s.budget, f.model, c, s.shape.layout, s.shape.schedules,
                                   f.seed);
  const std::int32_t ignore = s.shape.schedules.vocab.ignore_index;
  s.source = !f.data.empty() ? token_file_source(f.data, f.seq_len, f.eval_fraction, c.vocab_size)
             : f.task_name() == "random" ? random_ids_source(c.vocab_size, f.seq_len, f.seed)
             : f.task_name() == "kv"
                 ? kv_retrieval_source(KvRetrievalTask::standard(c.vocab_size, f.seq_len, f.seed, f.symbols), ignore)
                 : copy_task_source(CopyTask{c.vocab_size, f.seq_len, f.symbols, f.seed}, ignore);
  TrainerOptions topt;
  topt.optimizer = std::string(f.schedules.optimizer());
  topt.optimizer_options.in_place = in_place_optimizer(f);
  topt.optimizer_options.adam.lr = static_cast<float>(f.lr);
  topt.optimizer_options.adam.weight_decay = static_cast<float>(f.weight_decay);
  topt.optimizer_options.adam.max_grad_norm = static_cast<float>(f.max_grad_norm);
  topt.optimizer_options.adam.beta2 = static_cast<float>(f.beta2);
  topt.lr = LrSchedule{static_cast<float>(f.lr), static_cast<float>(f.min_lr), f.warmup, f.steps};
  topt.skip_nonfinite = f.on_nonfinite == "skip";
  topt.router_bias_speed = static_cast<float>(f.bias_update_speed);
  s.trainer.emplace(*s.m->model, s.m->host, s.m->pool, topt);
  s.say("data: " + s.source->describe() + "\n");

  // Resuming: the model, the optimizer and the data position of the checkpoint's step.
  RunState resumed;
  if (!f.resume.empty()) {
    const std::string from = resolve_checkpoint(f.resume);
    s.last_saved = from;
    resumed = load_checkpoint(from, *s.trainer);
    s.say(format("resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(resumed.step)));
    // What this run changes (refusals were made before any step, in validate).
    const std::string changes = check_resume(read_checkpoint_manifest(from), s.record, to_json(c), f.seed);
    if (!changes.empty()) s.say(changes + "\n");
    if (resumed.step >= f.steps) {
      s.say(format("the checkpoint is at step %lld, --steps is %lld: nothing to train\n",
                   static_cast<long long>(resumed.step), static_cast<long long>(f.steps)));
      s.nothing_to_train = true;
      return;
    }
  }
  s.B = f.batch, s.S = f.seq_len, s.M = f.accumulation;
  // Data parallel over the cp groups: the ranks of one hold the same sequences (each
  // computes its zigzag shard), so sequences are dealt by group, not by rank.
  s.DP = s.W / s.shape.layout.cp, s.drank = s.rank / s.shape.layout.cp;
  // The data position: global training sequences read before this process's first step.
  s.s0 = s.step = resumed.step, s.consumed0 = resumed.sequences_consumed, s.per_step = s.M * s.DP * s.B;
  if (model_is_path(f.model)) {
    const std::filesystem::path p(f.model);
    std::ifstream in(std::filesystem::is_directory(p) ? p / "config.json" : p, std::ios::binary);
    std::stringstream t;
    t << in.rdbuf();
    s.hf_config_text = t.str();
  }
  s.ids.resize(static_cast<std::size_t>(s.M));
  s.tgt.resize(static_cast<std::size_t>(s.M));
  s.eval_windows = std::min<std::int64_t>(f.eval_batches, s.source->eval_sequences() / (s.DP * s.B));
  if (s.lead && !f.metrics.empty())
    s.metrics = std::make_unique<MetricsWriter>(f.metrics, !f.resume.empty());  // a resume continues the history
  s.blind = s.source->blind_loss();
  if (!std::isnan(s.blind))
    s.say(format("a model blind to the context cannot beat %.4f nats on the scored tokens (unigram entropy)\n", s.blind));
  if (!f.memory_timeline.empty()) s.m->device->arena().start_timeline(s.rank, s.W);
  s.clock = Stopwatch();
}

Run::~Run() = default;

bool Run::done() const { return s_->nothing_to_train || s_->step >= s_->f.steps; }
std::int64_t Run::steps_done() const { return s_->step; }
const std::string& Run::last_saved() const { return s_->last_saved; }
Trainer& Run::trainer() { return *s_->trainer; }
Communicator& Run::world() { return *s_->m->world; }

double Run::evaluate() {
  State& s = *s_;
  std::vector<MicroBatch> eb;
  std::vector<std::vector<std::int32_t>> ei, et;
  for (std::int64_t k = 0; k < s.eval_windows; ++k) {
    s.fill(0, (k * s.DP + s.drank) * s.B, true);
    ei.push_back(s.ids[0]);
    et.push_back(s.tgt[0]);
  }
  for (std::size_t k = 0; k < ei.size(); ++k) eb.push_back({ei[k].data(), et[k].data(), s.B, s.S});
  return s.trainer->evaluate(eb);
}

RunStep Run::step() {
  State& s = *s_;
  const RunSettings& f = s.f;
  if (done()) throw InvalidArgument("Run::step: the run's " + std::to_string(f.steps) + " steps are taken");
  const std::int64_t step = s.step + 1;
  std::vector<MicroBatch> micro;
  for (std::int64_t m = 0; m < s.M; ++m) {
    s.fill(m, s.consumed0 + (((step - 1 - s.s0) * s.M + m) * s.DP + s.drank) * s.B, false);
    micro.push_back({s.ids[static_cast<std::size_t>(m)].data(), s.tgt[static_cast<std::size_t>(m)].data(), s.B, s.S});
  }
  RunStep r;
  const std::uint64_t ring0 = ring_attention_bytes_sent() + ulysses_attention_bytes_sent();
  // sync_phases: this thread's phase boundaries wait for the device during the step.
  struct BoundaryHook {
    explicit BoundaryHook(Device* dev) {
      if (dev) set_phase_boundary_hook([dev] { dev->synchronize(); });
    }
    ~BoundaryHook() { set_phase_boundary_hook({}); }
  } const hook(f.sync_phases ? s.m->device.get() : nullptr);
  r.stats = s.trainer->step(micro, s.stop);
  s.ring_bytes += ring_attention_bytes_sent() + ulysses_attention_bytes_sent() - ring0;
  const StepStats& st = r.stats;
  if (st.stopped != 0) return r;
  s.step = step;
  if (st.skipped) {
    ++s.skipped;
    s.say("\nskipped: " + st.nonfinite + "\n");
  }
  if (step == s.s0 + 1) s.first_loss = st.ce;  // the cross-entropy, as last_loss (the progress line adds the aux term)
  s.last_loss = st.ce;
  s.tokens_seen += static_cast<double>(st.inputs);
  s.scored_seen += static_cast<double>(st.tokens);
  s.train_seconds += st.seconds;
  for (std::size_t i = 0; i < kNumStepPhases; ++i) s.phases[i] += st.phases[i];
  s.communication += st.communication_seconds;
  s.step_seconds.push_back(st.seconds);
  std::optional<double> eval_loss;
  if (s.eval_windows > 0 && ((f.eval_every > 0 && step % f.eval_every == 0) || step == f.steps)) {
    eval_loss = evaluate();
    s.last_eval = eval_loss;
  }
  // A stop seen by any rank stops every rank after this step (one small all-reduce),
  // and whether a checkpoint's files are still being written anywhere.
  std::int64_t vitals[3] = {static_cast<std::int64_t>(s.m->device->arena().peak()), s.stop(),
                            s.writer && s.writer->writing() ? 1 : 0};
  s.m->world->all_reduce(vitals, 3, DType::i64, ReduceOp::max);
  if (s.writer && s.writer->pending() && vitals[2] == 0) s.finish_save();
  if (s.writer && ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps) && vitals[1] == 0)
    s.start_save(step);
  r.stop_signal = vitals[1];
  {
    StepReport& p = r.report;
    p.step = step;
    p.total_steps = f.steps;
    p.loss = st.loss;
    p.lr = st.lr;
    p.grad_norm = st.grad_norm;
    p.tokens_per_second = st.seconds > 0 ? static_cast<double>(st.inputs) / st.seconds : 0;
    p.device_peak_bytes = static_cast<std::uint64_t>(vitals[0]);
    p.elapsed_seconds = s.clock.seconds();
    p.eval_loss = eval_loss;
    r.report_due = progress_every(step, f.steps) || eval_loss;
    r.skipped_steps = s.skipped;
    if (s.metrics) s.metrics->write(r.json());  // rank 0's (the others have no writer)
  }
  return r;
}

nlohmann::json RunStep::json() const {
  nlohmann::json j = step_json(report);
  j["ce"] = stats.ce;
  j["aux"] = stats.aux;
  j["scored_tokens"] = stats.tokens;
  j["skipped"] = stats.skipped;
  j["skipped_steps"] = skipped_steps;
  return j;
}

void Run::save() {
  State& s = *s_;
  if (!s.writer) throw InvalidArgument("Run::save needs save_dir");
  if (s.writer->pending()) s.finish_save();
  s.start_save(s.step);
  s.finish_save();
}

void Run::save(const std::string& dir) {
  State& s = *s_;
  if (dir.empty()) throw InvalidArgument("Run::save: the folder must not be empty");
  if (!s.writer) {
    prepare_save_folder(dir);  // what validate() checks of a save_dir given at the start
    s.f.save_dir = dir;
    s.open_writer(*s.m->world);
  } else {
    std::error_code ec;
    if (!std::filesystem::equivalent(dir, s.f.save_dir, ec))
      throw InvalidArgument("Run::save: this run saves to " + s.f.save_dir + " (its save_dir), not " + dir);
  }
  save();
}

int Run::stop(const RunStep& last) {
  State& s = *s_;
  const RunSettings& f = s.f;
  if (last.stats.stopped != 0) {
    // A stop between two micro-batches: the step is abandoned on every rank, so the
    // state is that of the last complete step, which is saved (unless it is already, or
    // none completed) with its data position: the resume is exact.
    const std::int64_t step = s.step + 1, done = s.step;
    std::string tail = "no --save-dir, nothing saved";
    if (s.writer) {
      if (s.writer->pending()) s.finish_save();
      if (done > s.s0 && !(f.save_every > 0 && done % f.save_every == 0)) {
        s.start_save(done);
        s.finish_save();
      }
      tail = done > s.s0        ? "resume with --resume " + f.save_dir
             : f.resume.empty() ? std::string("no step completed, nothing saved")
                                : "resume with --resume " + f.resume;
    }
    s.say(format("\nstopped by signal %lld during step %lld (its micro-batches discarded: %lld of %lld run); %s\n",
                 static_cast<long long>(last.stats.stopped), static_cast<long long>(step),
                 static_cast<long long>(last.stats.micro_batches_done), static_cast<long long>(s.M), tail.c_str()));
    return s.writer ? 0 : 130;
  }
  if (!s.writer) {
    s.say(format("\nstopped by signal %lld after step %lld; no --save-dir, nothing saved\n",
                 static_cast<long long>(last.stop_signal), static_cast<long long>(s.step)));
    return 130;
  }
  s.start_save(s.step);
  s.finish_save();
  s.say(format("stopped by signal %lld after step %lld; resume with --resume %s\n",
               static_cast<long long>(last.stop_signal), static_cast<long long>(s.step), f.save_dir.c_str()));
  return 0;
}

namespace {
// --measure-gemm-peak's products: C[n, n] = A B at n = 2048, as `peakbound info` measures.
constexpr std::int64_t kMeasuredGemmSize = 2048;
}  // namespace

RunSummary Run::finish() {
  State& s = *s_;
  const RunSettings& f = s.f;
  Arena& arena = s.m->device->arena();
  if (s.writer) s.finish_save();
  if (!f.memory_timeline.empty()) {
    MemoryTimeline t = arena.take_timeline();
    const ModelConfig& c = s.shape.config;
    t.title = c.name + ", schedules " + f.schedules.str() + ", " + std::string(precision_name(f.precision)) +
              ", seq_len " + std::to_string(f.seq_len) + ", cp " + std::to_string(s.shape.layout.cp) + ", rank " +
              std::to_string(s.rank) + "/" + std::to_string(s.W);
    t.meta = nlohmann::json{{"model", c.name},   {"precision", precision_name(f.precision)},
                            {"schedules", f.schedules.str()}, {"seq_len", f.seq_len},
                            {"batch", f.batch},  {"cp", s.shape.layout.cp},
                            {"ep", s.shape.layout.ep},        {"ranks", s.W}}
                 .dump();
    write_memory_timeline(memory_timeline_path(f.memory_timeline, s.rank, s.W), t);
  }
  RunSummary sum;
  sum.planned = s.planned;
  sum.budget = s.budget;
  // Measured beside planned, per component (the largest over ranks of each).
  sum.measured.assign(kNumComponents + 1, 0);
  for (std::size_t i = 0; i < kNumComponents; ++i) sum.measured[i] = static_cast<std::int64_t>(arena.peak(kAllComponents[i]));
  sum.measured[kNumComponents] = static_cast<std::int64_t>(arena.peak());
  s.m->world->all_reduce(sum.measured.data(), sum.measured.size(), DType::i64, ReduceOp::max);
  // What was live at the largest rank's peak (the binding component is its largest):
  // that rank's breakdown, the others contributing zeros (ties: the lowest rank).
  std::int64_t key = sum.measured[kNumComponents] == static_cast<std::int64_t>(arena.peak()) ? s.W - s.rank : 0;
  s.m->world->all_reduce(&key, 1, DType::i64, ReduceOp::max);
  sum.at_peak.assign(kNumComponents, 0);
  if (key == s.W - s.rank) {
    const ComponentBytes b = arena.peak_breakdown();
    for (std::size_t i = 0; i < kNumComponents; ++i) sum.at_peak[i] = static_cast<std::int64_t>(b[i]);
  }
  s.m->world->all_reduce(sum.at_peak.data(), sum.at_peak.size(), DType::i64, ReduceOp::sum);
  sum.first_loss = s.first_loss;
  sum.last_loss = s.last_loss;
  sum.eval_loss = s.last_eval;
  sum.blind_loss = s.blind;
  sum.tokens_per_second = s.train_seconds > 0 ? s.tokens_seen / s.train_seconds : 0;
  // The head's FLOPs for the scored tokens only (model/model_flops.h).
  sum.scored_fraction = s.tokens_seen > 0 ? std::min(1.0, s.scored_seen / s.tokens_seen) : 1.0;
  sum.model_flops_per_token = model_flops_per_token(s.shape.config, s.S).per_token(sum.scored_fraction);
  sum.achieved_flops_per_second = sum.model_flops_per_token * sum.tokens_per_second;
  sum.gemm_peak = f.gemm_peak;
  if (f.measure_gemm_peak) {
    // Every rank at once (the all-reduce lines them up), each its own rate; the sum is the machine's.
    std::int64_t ready = 1;
    s.m->world->all_reduce(&ready, 1, DType::i64, ReduceOp::sum);
    const std::string want = f.precision == Precision::bf16 ? "bf16" : "f32";
    double rate = 0;
    for (const GemmRate& r : measure_gemm_rates(backend_name(s.m->device->backend()), kMeasuredGemmSize, 3))
      if (r.precision == want && rate == 0) rate = r.flops_per_second;  // the first: the process's own path
    s.m->world->all_reduce(&rate, 1, DType::f64, ReduceOp::sum);
    sum.gemm_peak = rate;
  }
  if (sum.gemm_peak > 0) sum.mfu = sum.achieved_flops_per_second / sum.gemm_peak;
  sum.steps = s.step - s.s0;
  sum.skipped = s.skipped;
  // The step's split by phase, the mean over ranks (on the CPU device, whose compute runs
  // on the step's thread; an asynchronous device's scopes would time launches only, unless
  // every phase boundary waited for it: sync_phases).
  std::array<double, kNumStepPhases + 1> ph{};
  std::copy(s.phases.begin(), s.phases.end(), ph.begin());
  ph[kNumStepPhases] = s.communication;
  s.m->world->all_reduce(ph.data(), ph.size(), DType::f64, ReduceOp::sum);
  if ((s.m->device->backend() == Backend::cpu || f.sync_phases) && sum.steps > 0) {
    sum.phases_synchronized = f.sync_phases;
    for (double& v : ph) v /= static_cast<double>(s.W);
    sum.phase_seconds.emplace();
    std::copy_n(ph.begin(), kNumStepPhases, sum.phase_seconds->begin());
    sum.communication_seconds = ph[kNumStepPhases];
  }
  // The most any rank's attention rings sent per step (0 without context parallelism).
  auto ring_bytes = static_cast<std::int64_t>(s.ring_bytes);
  s.m->world->all_reduce(&ring_bytes, 1, DType::i64, ReduceOp::max);
  sum.run = {{"model", s.shape.config.name},
             {"precision", precision_name(f.precision)},
             {"ranks", s.W},
             {"cp", s.shape.layout.cp},
             {"schedules", f.schedules.str()},
             {"keep_attention", s.shape.schedules.keep_attention},
             {"keep_logits", s.shape.schedules.vocab.keep_logits},
             {"keep_experts", s.shape.schedules.keep_experts},
             {"moe_tile", s.shape.schedules.moe_tile},
             {"prefetch_depth", s.shape.schedules.checkpoint.prefetch_depth},
             {"checkpoint_group", s.shape.schedules.checkpoint.group_layers},
             {"embedding", s.shape.schedules.vocab_parallel_embedding ? "vocab" : "fsdp"},
             {"context_attention", f.context_attention},
             {"steps", f.steps},
             {"inputs_per_step", s.W / s.shape.layout.cp * s.B * s.S * s.M},
             {"step_seconds", s.step_seconds},
             {"cp_ring_bytes_per_step", sum.steps > 0 ? ring_bytes / sum.steps : 0}};
  s.say(sum.text());
  return sum;
}

std::string RunSummary::text() const {
  std::string t = format("\n%-12s %14s %14s\n", "component", "planned", "measured");
  for (std::size_t i = 0; i <= kNumComponents; ++i) {
    if (i < kNumComponents && planned[i] == 0 && measured[i] == 0) continue;
    const std::string name = i < kNumComponents ? std::string(component_name(kAllComponents[i])) : "total";
    t += format("%-12s %14s %14s\n", name.c_str(), pad(format_bytes(double(planned[i])), 14).c_str(),
                pad(format_bytes(double(measured[i])), 14).c_str());
  }
  t += format("\nloss %.4f -> %.4f (cross-entropy on the scored tokens)", first_loss, last_loss);
  if (eval_loss) t += format(", held-out %.4f", *eval_loss);
  if (!std::isnan(blind_loss)) t += format(", context-blind bound %.4f", blind_loss);
  t += format("; %.0f tokens/s over %lld steps", tokens_per_second, static_cast<long long>(steps));
  if (skipped > 0) t += format(" (%lld skipped: non-finite)", static_cast<long long>(skipped));
  t += format("\nmodel %.3g FLOP/token x %.0f tokens/s = %.3g FLOP/s", model_flops_per_token, tokens_per_second,
              achieved_flops_per_second);
  if (scored_fraction < 1.0) t += format(" (the head's for the %.0f%% of tokens scored)", 100.0 * scored_fraction);
  if (mfu) t += format(", MFU %.1f%% of the GEMM peak %.3g FLOP/s", 100.0 * *mfu, gemm_peak);
  if (phase_seconds) {
    double total = 0;
    for (double v : *phase_seconds) total += v;
    t += phases_synchronized ? "\nstep time (mean over ranks, the device synchronized at every phase boundary):"
                             : "\nstep time (mean over ranks):";
    for (std::size_t i = 0; i < kNumStepPhases; ++i)
      t += format("%s %s %.0f%%", i == 0 ? "" : ",", std::string(step_phase_name(kAllStepPhases[i])).c_str(),
                  total > 0 ? 100.0 * (*phase_seconds)[i] / total : 0.0);
    if (communication_seconds)
      t += format("; exposed communication %.0f%% (across the phases)",
                  total > 0 ? 100.0 * *communication_seconds / total : 0.0);
  }
  return t + "\n";
}

nlohmann::json RunSummary::json() const {
  nlohmann::json table = nlohmann::json::object();
  for (std::size_t i = 0; i <= kNumComponents; ++i) {
    if (i < kNumComponents && planned[i] == 0 && measured[i] == 0) continue;
    const std::string name = i < kNumComponents ? std::string(component_name(kAllComponents[i])) : "total";
    table[name] = {{"planned_bytes", planned[i]}, {"measured_bytes", measured[i]}};
    if (i < kNumComponents) table[name]["at_peak_bytes"] = at_peak[i];
  }
  nlohmann::json j = {{"model", run["model"]},
                      {"precision", run["precision"]},
                      {"ranks", run["ranks"]},
                      {"cp", run["cp"]},
                      {"schedules", run["schedules"]},
                      {"keep_attention", run["keep_attention"]},
                      {"keep_logits", run["keep_logits"]},
                      {"keep_experts", run["keep_experts"]},
                      {"moe_tile", run["moe_tile"]},
                      {"prefetch_depth", run["prefetch_depth"]},
                      {"checkpoint_group", run["checkpoint_group"]},
                      {"embedding", run["embedding"]},
                      {"context_attention", run["context_attention"]},
                      {"steps", run["steps"]},
                      {"first_loss", first_loss},
                      {"final_loss", last_loss},
                      {"tokens_per_second", tokens_per_second},
                      {"inputs_per_step", run["inputs_per_step"]},
                      {"step_seconds", run["step_seconds"]},
                      {"cp_ring_bytes_per_step", run["cp_ring_bytes_per_step"]},
                      {"budget_bytes", budget},
                      {"peaks", table}};
  if (eval_loss) j["eval_loss"] = *eval_loss;
  if (!std::isnan(blind_loss)) j["blind_loss"] = blind_loss;
  j["model_flops_per_token"] = model_flops_per_token;
  j["scored_fraction"] = scored_fraction;
  j["achieved_flops_per_second"] = achieved_flops_per_second;
  if (mfu) j["mfu"] = *mfu;
  if (gemm_peak > 0) j["gemm_peak_flops_per_second"] = gemm_peak;
  if (phase_seconds) {
    nlohmann::json ph = nlohmann::json::object();
    for (std::size_t i = 0; i < kNumStepPhases; ++i)
      ph[std::string(step_phase_name(kAllStepPhases[i]))] = (*phase_seconds)[i];
    j["phase_seconds"] = ph;
    j["phases_synchronized"] = phases_synchronized;
  }
  if (communication_seconds) j["communication_seconds"] = *communication_seconds;
  return j;
}

}  // namespace peakbound
