// `peakbound bench checkpoint`: the checkpointed stack of residual MLP blocks with its
// boundaries resident (baseline) and under Selective Checkpoint Offload, on the same
// inputs in one run: checkpoint/device/host peaks, step time, throughput ratio, the
// copy engine's busy fraction, and whether outputs and gradients are bitwise equal.
// --sweep adds the checkpoint peak reduction for L = 1..32 against its target.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/checkpoint_flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/bench/checkpoint_run.h"

namespace peakbound::cli {

namespace {

// Defaults: the run's sizes from CheckpointRunConfig, the SCO knobs from CheckpointOptions.
struct BenchFlags {
  std::int64_t layers = CheckpointRunConfig{}.layers, tokens = CheckpointRunConfig{}.tokens,
               hidden = CheckpointRunConfig{}.hidden, ffn = CheckpointRunConfig{}.ffn;
  std::int64_t prefetch = CheckpointOptions{}.prefetch_depth;
  std::optional<std::int64_t> resident_layers = CheckpointOptions{}.resident_layers;  // unset: the policy
  std::string checkpoint_budget = std::to_string(CheckpointOptions{}.checkpoint_budget);
  std::string device_memory = "auto";  // auto: auto_device_memory, the resident baseline's
  double link_gbps = CheckpointOptions{}.link_gbps;
  int warmup = 1, reps = 5;
  std::uint64_t seed = CheckpointRunConfig{}.seed;
  std::string device = CheckpointRunConfig{}.device;
  bool sweep = false, json = false;
};

CheckpointRunConfig make_config(const BenchFlags& f, CheckpointSchedule s, std::int64_t layers) {
  CheckpointRunConfig c;
  c.layers = layers;
  c.tokens = f.tokens;
  c.hidden = f.hidden;
  c.ffn = f.ffn;
  c.seed = f.seed;
  c.device = f.device;
  c.options.schedule = s;
  c.options.prefetch_depth = f.prefetch;
  c.options.resident_layers = f.resident_layers;
  c.options.checkpoint_budget = parse_bytes(f.checkpoint_budget, "--checkpoint-budget");
  c.options.link_gbps = f.link_gbps;
  // Options and placement are checked here, before any run, so errors name the flags.
  with_checkpoint_flags([&] { return checkpoint_run_buffers(c, sizeof(float)); });
  // Both runs get the same budget: enough for the baseline unless the user sets one.
  if (f.device_memory != "auto") {
    c.device_memory = parse_bytes(f.device_memory, "--device-memory");
    if (*c.device_memory == 0) throw InvalidArgument("--device-memory must be positive, or auto");
  } else {
    c.device_memory = auto_device_memory(c);
  }
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool bitwise_equal(const CheckpointRun& a, const CheckpointRun& b) {
  return same_bits(a.output(), b.output()) && same_bits(a.input_grad(), b.input_grad()) &&
         same_bits(a.param_grads(), b.param_grads());
}

double reduction(std::uint64_t base, std::uint64_t sched) {
  return base ? 1.0 - static_cast<double>(sched) / static_cast<double>(base) : 0.0;
}

double target_reduction(std::int64_t prefetch, std::int64_t layers) {
  return 1.0 - static_cast<double>(prefetch + 1) / static_cast<double>(layers);
}

// Per-schedule timing and copy-engine totals over the timed steps.
struct Timing {
  std::vector<double> seconds;
  CheckpointCopyStep copies;  // summed
  double total_seconds = 0;
  void add(double s, const CheckpointCopyStep& c) {
    seconds.push_back(s);
    total_seconds += s;
    copies.d2h_bytes += c.d2h_bytes;
    copies.h2d_bytes += c.h2d_bytes;
    copies.memcpy_seconds += c.memcpy_seconds;
    copies.link_wait_seconds += c.link_wait_seconds;
    copies.stall_seconds += c.stall_seconds;
  }
  double best() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  }
  double busy_fraction() const {
    return total_seconds > 0 ? (copies.memcpy_seconds + copies.link_wait_seconds) / total_seconds : 0.0;
  }
};

nlohmann::json run_json(CheckpointRun& r, const Timing& t) {
  const auto steps = static_cast<double>(t.seconds.size());
  const double best = t.best();
  return {{"name", std::string(checkpoint_schedule_name(r.config().options.schedule))},
          {"placement", r.stack().placement().to_json()},
          {"checkpoint_peak_bytes", r.device().arena().peak(Component::checkpoints)},
          {"device_peak_bytes", r.device().arena().peak()},
          {"device_budget_bytes", r.device().arena().capacity()},
          {"host_peak_bytes", r.host().peak()},
          {"seconds", best},
          {"seconds_median", t.median()},
          {"seconds_all", t.seconds},
          {"tokens_per_second", static_cast<double>(r.config().tokens) / best},
          {"copy_engine",
           {{"d2h_bytes_per_step", static_cast<double>(t.copies.d2h_bytes) / steps},
            {"h2d_bytes_per_step", static_cast<double>(t.copies.h2d_bytes) / steps},
            {"memcpy_seconds_per_step", t.copies.memcpy_seconds / steps},
            {"emulated_link_wait_seconds_per_step", t.copies.link_wait_seconds / steps},
            {"busy_fraction", t.busy_fraction()},
            {"compute_stall_seconds_per_step", t.copies.stall_seconds / steps},
            {"compute_stall_fraction", t.total_seconds > 0 ? t.copies.stall_seconds / t.total_seconds : 0.0}}}};
}

// The checkpoint peak reduction for each L, one step per schedule (peaks, not time).
nlohmann::json sweep_json(const BenchFlags& f) {
  nlohmann::json out = nlohmann::json::array();
  for (std::int64_t L : {1, 2, 3, 4, 8, 16, 32}) {
    BenchFlags g = f;
    g.resident_layers = 0;  // the sweep offloads everything it can
    g.checkpoint_budget = "0";
    CheckpointRun base(make_config(g, CheckpointSchedule::resident, L));
    CheckpointRun sco(make_config(g, CheckpointSchedule::sco, L));
    base.step();
    sco.step();
    const std::uint64_t cb = base.device().arena().peak(Component::checkpoints);
    const std::uint64_t cs = sco.device().arena().peak(Component::checkpoints);
    const double red = reduction(cb, cs), target = target_reduction(f.prefetch, L);
    out.push_back({{"layers", L},
                   {"resident_checkpoint_peak_bytes", cb},
                   {"sco_checkpoint_peak_bytes", cs},
                   {"sco_host_peak_bytes", sco.host().peak()},
                   {"checkpoint_peak_reduction", red},
                   {"target_reduction", target},
                   {"target_met", red >= target - 1e-12},
                   {"bitwise_equal", bitwise_equal(base, sco)}});
  }
  return out;
}

int run_bench(const BenchFlags& f) {
  if (f.reps < 1 || f.warmup < 0) throw InvalidArgument("--reps must be >= 1 and --warmup >= 0");
  CheckpointRun base(make_config(f, CheckpointSchedule::resident, f.layers));
  CheckpointRun sco(make_config(f, CheckpointSchedule::sco, f.layers));
  // Interleaved, so drift on a shared machine hits both schedules alike.
  for (int i = 0; i < f.warmup; ++i) {
    base.step();
    sco.step();
  }
  Timing tb, ts;
  for (int i = 0; i < f.reps; ++i) {
    double s = base.step();
    tb.add(s, base.last_copy_step());
    s = sco.step();
    ts.add(s, sco.last_copy_step());
  }
  const bool equal = bitwise_equal(base, sco);
  const std::uint64_t cb = base.device().arena().peak(Component::checkpoints);
  const std::uint64_t cs = sco.device().arena().peak(Component::checkpoints);
  const double red = reduction(cb, cs), target = target_reduction(f.prefetch, f.layers);
  const double ratio = tb.best() / ts.best();
  const bool emulated = f.link_gbps > 0;

  nlohmann::json j;
  j["benchmark"] = "checkpoint";
  j["config"] = {{"device", f.device},
                 {"layers", f.layers},
                 {"tokens", f.tokens},
                 {"hidden", f.hidden},
                 {"ffn", base.config().resolved_ffn()},
                 {"prefetch_depth", f.prefetch},
                 {"resident_layers_flag", f.resident_layers ? nlohmann::json(*f.resident_layers) : nlohmann::json(nullptr)},
                 {"checkpoint_budget_bytes", sco.config().options.checkpoint_budget},
                 {"warmup", f.warmup},
                 {"reps", f.reps},
                 {"seed", f.seed},
                 {"dtype", "f32"}};
  j["link_emulation"] = {{"enabled", emulated},
                         {"gbytes_per_second", emulated ? nlohmann::json(f.link_gbps) : nlohmann::json(nullptr)},
                         {"note", emulated ? "copies are slowed to the emulated host-link bandwidth on the CPU copy engine"
                                           : "off: copies run at memcpy speed on the CPU copy engine"}};
  j["runs"] = nlohmann::json::array({run_json(base, tb), run_json(sco, ts)});
  j["checkpoint_peak_reduction"] = red;
  j["target_checkpoint_peak_reduction"] = target;
  j["checkpoint_target_met"] = red >= target - 1e-12;
  j["throughput_ratio"] = ratio;
  j["throughput_target"] = 0.95;
  j["throughput_target_met"] = emulated ? nlohmann::json(nullptr) : nlohmann::json(ratio >= 0.95);
  j["bitwise_equal"] = equal;
  j["copy_engine_busy_fraction"] = ts.busy_fraction();
  j["compute_stall_fraction"] = ts.total_seconds > 0 ? ts.copies.stall_seconds / ts.total_seconds : 0.0;
  if (f.sweep) j["sweep"] = sweep_json(f);
  j["machine"] = bench::machine_info();

  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    char link[64] = "memcpy (no emulation)";
    if (emulated) std::snprintf(link, sizeof link, "%g GB/s (emulated)", f.link_gbps);
    std::printf("checkpoint: %lld layers, %lld tokens, hidden %lld, ffn %lld, prefetch %lld, link %s\n",
                static_cast<long long>(f.layers), static_cast<long long>(f.tokens), static_cast<long long>(f.hidden),
                static_cast<long long>(base.config().resolved_ffn()), static_cast<long long>(f.prefetch), link);
    for (const auto& r : j["runs"])
      std::printf("  %-8s checkpoints %10s  device %10s  host %10s  %.4f s  %.0f tokens/s\n",
                  r["name"].get<std::string>().c_str(),
                  format_bytes(r["checkpoint_peak_bytes"].get<double>()).c_str(),
                  format_bytes(r["device_peak_bytes"].get<double>()).c_str(),
                  format_bytes(r["host_peak_bytes"].get<double>()).c_str(), r["seconds"].get<double>(),
                  r["tokens_per_second"].get<double>());
    std::printf("  checkpoint peak reduction %.3f (target >= %.3f), throughput ratio %.3f, copy engine busy %.3f, "
                "compute stalled %.3f, bitwise equal: %s\n",
                red, target, ratio, ts.busy_fraction(), j["compute_stall_fraction"].get<double>(), equal ? "yes" : "NO");
    if (f.sweep)
      for (const auto& s : j["sweep"])
        std::printf("  sweep L=%-3lld reduction %.3f target %.3f %s\n", static_cast<long long>(s["layers"].get<std::int64_t>()),
                    s["checkpoint_peak_reduction"].get<double>(), s["target_reduction"].get<double>(),
                    s["target_met"].get<bool>() ? "met" : "NOT met");
  }
  if (!equal) throw InternalError("bench checkpoint: sco's outputs or gradients differ from the resident run");
  return 0;
}

Command add_bench_checkpoint(CLI::App& parent) {
  auto f = std::make_shared<BenchFlags>();
  Command c;
  c.app = parent.add_subcommand("checkpoint",
                                "Checkpoint boundaries resident vs Selective Checkpoint Offload (SCO), same inputs, one JSON");
  auto* a = c.app;
  int_flag(a, "--layers", f->layers, "Blocks in the stack (L)", 1, 4096);
  int_flag(a, "--tokens", f->tokens, "Tokens per step (T)", 1, 1 << 24);
  int_flag(a, "--hidden", f->hidden, "Hidden size (H)", 1, 1 << 16);
  int_flag(a, "--ffn", f->ffn, "MLP intermediate size (F); 0 = 8/3 H rounded up to 64", 0, 1 << 18);
  int_flag(a, "--prefetch", f->prefetch, "SCO prefetch depth D (ring of D + 1 device slots; 0: one slot, the blocks in place)", 0, 1024);
  optional_int_flag(a, "--resident-layers", f->resident_layers,
                    "SCO: keep the last K boundaries resident, 0 <= K <= --layers; omit to let --checkpoint-budget decide",
                    0, 4096);
  a->add_option("--checkpoint-budget", f->checkpoint_budget, "SCO policy: device bytes for boundaries (0 = offload all but the ring)")
      ->capture_default_str();
  real_flag(a, "--link-gbps", f->link_gbps,
            "Emulate a host link of this many GB/s (1e9 bytes/s, at least " +
                CLI::detail::to_string(CheckpointOptions::kMinLinkGbps) + ") on the copy engine; 0 = off",
            0.0, 1e6);
  a->add_option("--device-memory", f->device_memory,
                "Device budget of each run (> 0, e.g. 64MiB), or auto: the resident baseline's footprint peak plus "
                "1/16 and 8 MiB")
      ->capture_default_str();
  int_flag(a, "--warmup", f->warmup, "Untimed steps per schedule before timing", 0, 1000);
  int_flag(a, "--reps", f->reps, "Timed steps per schedule (interleaved; the fastest is reported)", 1, 1000);
  seed_flag(a, "--seed", f->seed, "Seed of parameters and inputs");
  a->add_flag("--sweep", f->sweep, "Also measure the checkpoint peak reduction for L = 1, 2, 3, 4, 8, 16, 32");
  device_flag(a, f->device);
  a->add_flag("--json", f->json, "Print one JSON object");
  c.run = [f] { return run_bench(*f); };
  return c;
}

const bool registered = register_command("bench", "checkpoint", &add_bench_checkpoint);

}  // namespace

}  // namespace peakbound::cli
