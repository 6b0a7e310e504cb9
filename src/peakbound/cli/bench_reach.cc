// `peakbound bench reach`: the composed result measured with real training steps. For the
// FSDP2-style baseline (schedules none), each schedule alone added to it (an ablation) and
// all four, the largest context at which one full training step (forward, backward,
// optimizer) completes within the device budget, on the same ranks and layout: doubling,
// then bisection (bench/reach_search.h). Each trial is its own job, `mpirun -np R peakbound
// train --steps N --device-memory B --no-plan-check`, so a step the arena refuses ends that
// job only. At each reach: the binding component (the largest one live at the peak) and
// the step's tokens/s; at the baseline's reach, the baseline and all four side by side
// for throughput; at the scheduled reach, the plan beside the measured peak per component.
// With --peer-json (bench/peer_fsdp2.py's output) the same against PyTorch FSDP2.
// Run it without mpirun: it launches its own ranks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/bench/harness.h"
#include "peakbound/bench/reach_budget.h"
#include "peakbound/bench/reach_search.h"
#include "peakbound/bench/subprocess.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/train/model_spec.h"
#include "peakbound/core/component.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/io/path_check.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/schedule_set.h"
#include "peakbound/train/moe_transformer.h"
#include "peakbound/train/run.h"

#include <unistd.h>

namespace peakbound::cli {

namespace {

struct ReachFlags {
  std::string budget = "192MiB";
  std::string device = "cpu";  // passed to every train job
  int ranks = 4;
  std::string model = "tiny-moe";
  std::string precision = std::string(precision_name(RunSettings{}.precision));  // passed to every train job
  std::int64_t cp = 0, ep = 0, vocab_group = 0;
  std::string configs = "none,llep,dtp,sco,adam,all";
  std::int64_t start = 512, max_context = std::int64_t{1} << 20, multiple = 64;
  double resolution = 1.0 / 16;
  // A trial fits when every one of its steps does: the baseline's dispatch depends on the
  // routing, which the first updates change (a 1-step trial overstates its reach).
  int trial_steps = 3;
  std::string mpirun = "mpirun";
  std::string peer_json, timeline_dir;
  // The throughput at the baseline's reach also with the scheduled job keeping the attention
  // (train --keep-attention): what the memory the schedules free buys in speed.
  bool keep_attention = false;
  bool json = false;
};

// A configuration of the ablation: its name in the JSON and its --schedules.
struct Config {
  std::string name, schedules;
};

std::vector<Config> parse_configs(const std::string& list) {
  std::vector<Config> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == "none") {
      out.push_back({"baseline", "none"});
      continue;
    }
    if (item == "all") {
      out.push_back({"scheduled", "all"});
      continue;
    }
    // One schedule, or several joined by '+' (added one by one: dtp+adam); the configs
    // themselves are separated by ',', so each is parsed alone (ScheduleSet's one parser).
    if (item.empty()) throw InvalidArgument("--configs: an empty configuration (two commas in a row?)");
    out.push_back({item, ScheduleSet::parse(item, "--configs").str()});
  }
  if (out.empty()) throw InvalidArgument("--configs names no configuration");
  return out;
}

// One training job's outcome: the JSON summary `train --json` printed when it fitted.
struct Trial {
  std::int64_t context = 0;
  bool fits = false;
  double wall_seconds = 0;
  nlohmann::json summary;  // null when it did not fit
  std::string refusal;     // the arena's refusal when it did not fit
};

double tokens_per_second(const nlohmann::json& s, int skip_first) {
  const auto& steps = s.at("step_seconds");
  double t = 0;
  int n = 0;
  for (std::size_t i = static_cast<std::size_t>(skip_first); i < steps.size(); ++i, ++n) t += steps[i].get<double>();
  if (n == 0 || t <= 0) return 0;
  return s.at("inputs_per_step").get<double>() * n / t;
}

std::string binding_of(const nlohmann::json& s) {
  std::string best;
  std::int64_t most = -1;
  for (const auto& [name, row] : s.at("peaks").items()) {
    if (name == "total" || !row.contains("at_peak_bytes")) continue;
    const std::int64_t b = row["at_peak_bytes"].get<std::int64_t>();
    if (b > most) most = b, best = name;
  }
  return best;
}

class Runner {
 public:
  Runner(const ReachFlags& f, std::int64_t budget) : f_(f), budget_(budget), exe_(bench::self_executable()) {}

  // One job of `steps` steps at `context` under `schedules`; a refusal by the arena is
  // "does not fit", any other failure ends the benchmark with the job's error.
  // `batch` sequences per data-parallel group (the search's jobs train one). The data is
  // random ids with every token scored (`--task random`), as PyTorch's peer trains: the
  // copy task scores half its tokens, and Ring-DTP leaves the others out where the
  // baseline and torch do not, so its throughput ratios would not compare equal work.
  Trial run(const std::string& schedules, std::int64_t context, int steps, const std::string& timeline = "",
            bool keep_attention = false, std::int64_t batch = 1) {
    std::vector<std::string> argv = bench::mpirun_argv(f_.mpirun, f_.ranks);
    argv.insert(argv.end(), {exe_, "train", "--model", f_.model, "--seq-len", std::to_string(context), "--batch",
                             std::to_string(batch),
                             "--steps", std::to_string(steps), "--cp", std::to_string(cp()), "--ep",
                             std::to_string(f_.ep), "--vocab-group", std::to_string(f_.vocab_group), "--schedules",
                             schedules, "--device-memory", std::to_string(budget_), "--no-plan-check",
                             "--eval-batches", "0", "--warmup", "0", "--task", "random", "--json"});
    argv.insert(argv.end(), {"--device", f_.device, "--precision", f_.precision});
    if (!timeline.empty()) argv.insert(argv.end(), {"--memory-timeline", timeline});
    if (keep_attention) argv.push_back("--keep-attention");
    bench::Stopwatch w;
    const bench::ProcessResult p = bench::run_process(argv);
    Trial t;
    t.context = context;
    t.wall_seconds = w.seconds();
    if (p.exit_code == 0) {
      const std::size_t at = p.out.rfind("\n{");
      const std::string line = p.out.substr(at == std::string::npos ? 0 : at + 1);
      try {
        t.summary = nlohmann::json::parse(line.substr(0, line.find('\n')));
      } catch (const nlohmann::json::exception&) {
        throw Error("bench reach: the job at context " + std::to_string(context) + " (schedules " + schedules +
                    ") printed no JSON summary");
      }
      t.fits = true;
    } else {
      const std::string msg = bench::error_line(p.err);
      if (msg.find("cannot allocate") == std::string::npos || msg.find("budget in use") == std::string::npos)
        throw Error("bench reach: the job at context " + std::to_string(context) + " (schedules " + schedules +
                    ") failed (exit " + std::to_string(p.exit_code) + "): " + bench::failure_reason(argv, p));
      t.refusal = msg;
    }
    std::fprintf(stderr, "  %-9s context %8lld: %s (%.1f s)\n", schedules.c_str(), static_cast<long long>(context),
                   t.fits ? "fits" : "refused", t.wall_seconds);
    return t;
  }

  std::int64_t cp() const { return f_.cp > 0 ? f_.cp : f_.ranks; }

 private:
  const ReachFlags& f_;
  std::int64_t budget_;
  std::string exe_;
};

nlohmann::json trial_json(const Trial& t) {
  nlohmann::json j = {{"context", t.context}, {"fits", t.fits}, {"wall_seconds", t.wall_seconds}};
  if (t.fits) j["peak_bytes"] = t.summary["peaks"]["total"]["measured_bytes"];
  else j["refusal"] = t.refusal;
  return j;
}

// The last JSON line of bench/peer_fsdp2.py's output, with the fields the comparison reads
// (each a number, or null when nothing fitted) and run at `precision` (its "precision";
// outputs without one were fp32 runs); InvalidArgument naming the file otherwise.
nlohmann::json read_peer_json(const std::string& path, const std::string& precision) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InvalidArgument("--peer-json: '" + path + "' is a folder, not bench/peer_fsdp2.py's output file");
  require_input_file(path, "--peer-json", "bench/peer_fsdp2.py's output file");  // a FIFO would block the open
  std::ifstream in(path);
  if (!in) throw InvalidArgument("--peer-json: cannot read '" + path + "'");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') last = line;
  nlohmann::json peer;
  try {
    peer = nlohmann::json::parse(last);
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument("--peer-json: '" + path + "' holds no JSON line (bench/peer_fsdp2.py prints one)");
  }
  for (const char* key : {"reach_tokens", "tokens_per_second_at_reach"}) {
    if (!peer.contains(key))
      throw InvalidArgument("--peer-json: '" + path + "' has no \"" + key +
                            "\" (bench/peer_fsdp2.py's output line has reach_tokens and tokens_per_second_at_reach)");
    if (!peer[key].is_null() && !(peer[key].is_number() && peer[key].get<double>() >= 0))
      throw InvalidArgument("--peer-json: '" + path + "': \"" + key + "\" is " + peer[key].dump() +
                            ", not a non-negative number or null");
  }
  const nlohmann::json p = peer.value("precision", nlohmann::json("f32"));
  if (!p.is_string() || p.get<std::string>() != precision)
    throw InvalidArgument("--peer-json: '" + path + "' is a " + (p.is_string() ? p.get<std::string>() : p.dump()) +
                          " run of bench/peer_fsdp2.py and this bench runs " + precision + " (run the peer with " +
                          "--precision " + precision + ", or this bench with --precision " +
                          (p.is_string() ? p.get<std::string>() : std::string("f32")) + ")");
  return peer;
}

// --timeline-dir: a folder (made when missing) the jobs can write their timelines into.
void check_timeline_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw InvalidArgument("--timeline-dir: '" + dir +
                          "' exists and is not a folder (the timelines none.json and all.json are written into it)");
  if (!fs::exists(st) && !fs::create_directories(dir, ec) && ec)
    throw InvalidArgument("--timeline-dir: cannot create the folder '" + dir + "': " + ec.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InvalidArgument("--timeline-dir: cannot write into '" + dir + "'");
}

// The reach's configurations as schedule lists.
std::vector<std::string> schedule_lists(const std::vector<Config>& configs) {
  std::vector<std::string> out;
  for (const Config& c : configs) out.push_back(c.schedules);
  return out;
}

// The JSON's header: what was measured, on what, and how the search went about it.
nlohmann::json reach_header(const ReachFlags& f, std::int64_t budget, std::int64_t cp) {
  return {{"bench", "reach"},
          {"model", f.model},
          {"precision", f.precision},
          {"ranks", f.ranks},
          {"layout", {{"cp", cp}, {"ep", f.ep}, {"vocab_group", f.vocab_group}}},
          {"budget_bytes", budget},
          {"device", f.device},
          {"method",
           "largest context (tokens per sequence, one sequence per cp group) at which a full training "
           "step completes within the budget: doubling from " +
               std::to_string(f.start) + ", then bisection to 1/" +
               std::to_string(static_cast<int>(std::lround(1 / f.resolution))) + "; every trial a fresh job of " +
               std::to_string(f.trial_steps) +
               " real steps, fitting when every step completes; tokens/s from the steps after the first"},
          {"machine", bench::machine_info()}};
}

// The losses of a baseline and a scheduled job side by side. Both train the same model on
// the same data, so they differ only by f32 reduction order; the first step's is before any
// update, the last one's after the trial's updates (gradients and the optimizer included).
nlohmann::json loss_pair(const Trial& b, const Trial& s) {
  auto rel = [](double x, double y) { return std::fabs(x - y) / std::max(std::fabs(x), 1e-30); };
  const double b1 = b.summary.value("first_loss", 0.0), s1 = s.summary.value("first_loss", 0.0);
  const double bl = b.summary.value("final_loss", 0.0), sl = s.summary.value("final_loss", 0.0);
  return {{"baseline_first_loss", b1},
          {"scheduled_first_loss", s1},
          {"baseline_last_loss", bl},
          {"scheduled_last_loss", sl},
          {"first_loss_relative_difference", rel(b1, s1)},
          {"last_loss_relative_difference", rel(bl, sl)}};
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// One `bench reach`: each configuration's search, then the runs and comparisons that read
// the reaches found, then the JSON or the table. Every job goes through runner_, in order.
class Reach {
 public:
  explicit Reach(const ReachFlags& f)
      : f_(f),
        budget_(static_cast<std::int64_t>(parse_bytes(f.budget, "--budget"))),
        configs_(parse_configs(f.configs)),
        runner_(f, budget_) {}

  int run() {
    out_ = reach_header(f_, budget_, runner_.cp());
    for (const Config& c : configs_) search(c);
    require_a_fit();
    out_["reach_tokens"] = reach_;
    out_["binding"] = binding_;
    out_["configs"] = per_config_;
    measure_throughput_at_baseline_reach();
    compare_plan_with_measured();
    if (!f_.peer_json.empty()) compare_with_peer();
    if (f_.json) std::printf("%s\n", out_.dump().c_str());
    else print_table();
    return 0;
  }

 private:
  // The search for one configuration's reach, each trial its own job, and its JSON entry.
  void search(const Config& c) {
    std::fprintf(stderr, "%s (schedules %s):\n", c.name.c_str(), c.schedules.c_str());
    bench::ReachSearchOptions so;
    so.start = f_.start;
    so.max_context = f_.max_context;
    so.multiple = f_.multiple;
    so.resolution = f_.resolution;
    std::map<std::int64_t, Trial> trials;
    const bench::ReachSearch r = bench::search_reach(
        [&](std::int64_t ctx) {
          Trial t = runner_.run(c.schedules, ctx, f_.trial_steps);
          const bool ok = t.fits;
          trials[ctx] = std::move(t);
          return ok;
        },
        so);
    nlohmann::json cj = {{"schedules", c.schedules}, {"reach_tokens", r.reach}, {"capped", r.capped}};
    cj["first_refused_tokens"] = r.first_failure;
    nlohmann::json tj = nlohmann::json::array();
    for (const bench::ReachTrial& rt : r.trials) tj.push_back(trial_json(trials[rt.context]));
    cj["trials"] = tj;
    if (r.reach > 0) describe_reach(c, trials[r.reach], cj);
    if (!trials.empty() && r.first_failure > 0) {
      // The component whose allocation the arena refused just past the reach: the peak that
      // grows into the budget (the largest one at the peak may be constant state).
      const std::string& why = trials[r.first_failure].refusal;
      cj["refusal_at_first_refused"] = why;
      const std::size_t q = why.find(" for '");
      if (q != std::string::npos) cj["refused_by"] = why.substr(q + 6, why.find('\'', q + 6) - q - 6);
    }
    reach_[c.name] = r.reach;
    per_config_[c.name] = cj;
  }

  // The job at a configuration's reach: the binding component, the peak, what was live at
  // it, and the step's tokens/s.
  void describe_reach(const Config& c, const Trial& t, nlohmann::json& cj) {
    cj["binding"] = binding_of(t.summary);
    cj["peak_bytes"] = t.summary["peaks"]["total"]["measured_bytes"];
    cj["at_peak_bytes"] = nlohmann::json::object();
    for (const auto& [name, row] : t.summary["peaks"].items())
      if (row.contains("at_peak_bytes") && row["at_peak_bytes"].get<std::int64_t>() > 0)
        cj["at_peak_bytes"][name] = row["at_peak_bytes"];
    cj["tokens_per_second"] = tokens_per_second(t.summary, 1);
    binding_[c.name] = cj["binding"];
    at_reach_[c.name] = t;
  }

  // Not one job fitted: a table of zeros says nothing; the smallest job's refusal says why.
  void require_a_fit() const {
    bool any_fit = false;
    std::int64_t smallest = 0;
    std::string smallest_refusal, smallest_schedules;
    for (const Config& c : configs_) {
      const nlohmann::json& cj = per_config_[c.name];
      if (cj["reach_tokens"].get<std::int64_t>() > 0) any_fit = true;
      for (const nlohmann::json& t : cj["trials"])
        if (!t["fits"].get<bool>() && (smallest == 0 || t["context"].get<std::int64_t>() < smallest)) {
          smallest = t["context"].get<std::int64_t>();
          smallest_refusal = t.value("refusal", std::string());
          smallest_schedules = c.schedules;
        }
    }
    if (!any_fit)
      throw Error("bench reach: every job was refused, down to context " + std::to_string(smallest) +
                  " (schedules " + smallest_schedules + "): " + smallest_refusal);
  }

  // Throughput side by side at the baseline's largest context: each a fresh job of the
  // trials' steps, the first step (fresh memory) left out, baseline and scheduled
  // alternating twice. (The baseline's job repeats its fitting trial; its routing, and so
  // its dispatch peak, may still differ by rounding: a refusal is reported, not hidden.)
  void measure_throughput_at_baseline_reach() {
    const bool both = reach_.contains("baseline") && reach_.contains("scheduled");
    const std::int64_t base_reach = both ? reach_["baseline"].get<std::int64_t>() : 0;
    if (!both || base_reach <= 0) return;
    out_["reach_ratio"] = reach_["scheduled"].get<double>() / static_cast<double>(base_reach);
    std::vector<double> base_tps, sched_tps, kept_tps;
    nlohmann::json losses = nlohmann::json::array();  // exactness on the side
    int refused = 0;
    bool kept_same_losses = true;
    const int steps = std::max(2, f_.trial_steps);
    for (int rep = 0; rep < 2; ++rep) {
      Trial b = runner_.run("none", base_reach, steps, timeline(rep, "none"));
      Trial s = runner_.run("all", base_reach, steps, timeline(rep, "all"));
      if (b.fits) base_tps.push_back(tokens_per_second(b.summary, 1));
      else ++refused;
      if (s.fits) sched_tps.push_back(tokens_per_second(s.summary, 1));
      else ++refused;
      if (b.fits && s.fits) losses.push_back(loss_pair(b, s));
      if (!f_.keep_attention) continue;
      // The same scheduled job keeping the attention: the same losses bit for bit.
      Trial k = runner_.run("all", base_reach, steps, "", true);
      if (k.fits) kept_tps.push_back(tokens_per_second(k.summary, 1));
      else ++refused;
      if (k.fits && s.fits)
        kept_same_losses = kept_same_losses && k.summary["first_loss"] == s.summary["first_loss"] &&
                           k.summary["final_loss"] == s.summary["final_loss"];
    }
    out_["throughput_at_baseline_reach"] = {{"context", base_reach},
                                            {"baseline_tokens_per_second", base_tps},
                                            {"scheduled_tokens_per_second", sched_tps},
                                            {"jobs_refused", refused},
                                            {"losses", losses}};
    if (!base_tps.empty() && !sched_tps.empty())
      out_["throughput_ratio_at_baseline_reach"] = mean(sched_tps) / mean(base_tps);
    if (f_.keep_attention) {
      out_["throughput_at_baseline_reach"]["scheduled_keep_attention_tokens_per_second"] = kept_tps;
      out_["throughput_at_baseline_reach"]["keep_attention_same_losses"] = kept_same_losses;
      if (!base_tps.empty() && !kept_tps.empty())
        out_["throughput_ratio_at_baseline_reach_keep_attention"] = mean(kept_tps) / mean(base_tps);
    }
  }

  // --timeline-dir: the first repetition's jobs write their memory timelines (none.json, all.json).
  std::string timeline(int rep, const std::string& schedules) const {
    return f_.timeline_dir.empty() || rep > 0 ? "" : f_.timeline_dir + "/" + schedules + ".json";
  }

  // The plan (train's footprint, printed before step 1) beside the measured peak at the
  // scheduled reach, per component and in total.
  void compare_plan_with_measured() {
    if (!at_reach_.count("scheduled")) return;
    nlohmann::json pvm = nlohmann::json::object();
    double worst = 0;
    for (const auto& [name, row] : at_reach_["scheduled"].summary["peaks"].items()) {
      const double p = row["planned_bytes"].get<double>(), m = row["measured_bytes"].get<double>();
      const double err = m > 0 ? std::abs(p - m) / m : (p > 0 ? 1.0 : 0.0);
      worst = std::max(worst, err);
      pvm[name] = {{"planned_bytes", row["planned_bytes"]}, {"measured_bytes", row["measured_bytes"]},
                   {"relative_difference", err}};
    }
    out_["plan_vs_measured"] = pvm;
    out_["plan_worst_relative_difference"] = worst;
  }

  // --peer-json: the scheduled reach beside PyTorch FSDP2's, and the scheduled throughput at
  // FSDP2's reach beside its: one job as the search runs them (one sequence a cp group), and
  // one that trains as many sequences a step as FSDP2 did (one a rank: --batch the peer's
  // ranks over this layout's data-parallel groups), so that both do the same work a step.
  void compare_with_peer() {
    const nlohmann::json peer = read_peer_json(f_.peer_json, f_.precision);  // checked by validate() already
    out_["torch_fsdp2"] = peer;
    // A field the peer left null (nothing fitted) reads as 0.
    auto number = [&](const char* key) {
      return peer.contains(key) && peer[key].is_number() ? peer[key].get<double>() : 0.0;
    };
    const double peer_reach = number("reach_tokens");
    if (peer_reach <= 0 || !reach_.contains("scheduled")) return;
    out_["reach_ratio_vs_torch_fsdp2"] = reach_["scheduled"].get<double>() / peer_reach;
    const double peer_tps = number("tokens_per_second_at_reach");
    if (peer_tps <= 0) return;
    Trial s = runner_.run("all", static_cast<std::int64_t>(peer_reach), std::max(2, f_.trial_steps));
    if (!s.fits) return;
    out_["throughput_vs_torch_fsdp2"] = {{"context", peer_reach},
                                         {"scheduled_tokens_per_second", tokens_per_second(s.summary, 1)},
                                         {"torch_tokens_per_second", peer_tps}};
    out_["throughput_ratio_vs_torch_fsdp2"] = tokens_per_second(s.summary, 1) / peer_tps;
    const std::int64_t peer_sequences = static_cast<std::int64_t>(number("ranks"));
    const std::int64_t dp = f_.ranks / runner_.cp();
    if (peer_sequences <= 0 || peer_sequences % dp != 0) return;
    const std::int64_t batch = peer_sequences / dp;
    if (batch == 1) {  // the job above already trained as many sequences a step
      out_["throughput_ratio_vs_torch_fsdp2_same_batch"] = out_["throughput_ratio_vs_torch_fsdp2"];
      return;
    }
    Trial b = runner_.run("all", static_cast<std::int64_t>(peer_reach), std::max(2, f_.trial_steps), "", false, batch);
    if (!b.fits) return;
    out_["throughput_vs_torch_fsdp2_same_batch"] = {
        {"context", peer_reach},
        {"sequences_per_step", peer_sequences},
        {"batch", batch},
        {"scheduled_tokens_per_second", tokens_per_second(b.summary, 1)},
        {"torch_tokens_per_second", peer_tps}};
    out_["throughput_ratio_vs_torch_fsdp2_same_batch"] = tokens_per_second(b.summary, 1) / peer_tps;
  }

  void print_table() const {
    std::printf("bench reach: %s on %d ranks (cp %lld), budget %s per rank\n", f_.model.c_str(), f_.ranks,
                static_cast<long long>(runner_.cp()), format_bytes(double(budget_)).c_str());
    std::printf("%-14s %-20s %8s %12s %12s %10s\n", "config", "schedules", "reach", "refused by", "largest",
                "tokens/s");
    for (const Config& c : configs_) {
      const nlohmann::json& cj = per_config_[c.name];
      std::printf("%-14s %-20s %8lld %12s %12s %10.0f\n", c.name.c_str(), c.schedules.c_str(),
                  static_cast<long long>(cj["reach_tokens"].get<std::int64_t>()),
                  cj.value("refused_by", std::string("-")).c_str(), cj.value("binding", std::string("-")).c_str(),
                  cj.value("tokens_per_second", 0.0));
    }
    if (out_.contains("reach_ratio"))
      std::printf("reach ratio %.2fx; throughput at the baseline's reach %.2fx\n", out_["reach_ratio"].get<double>(),
                  out_.value("throughput_ratio_at_baseline_reach", 0.0));
    if (out_.contains("throughput_ratio_at_baseline_reach_keep_attention"))
      std::printf("throughput at the baseline's reach, the scheduled job keeping the attention: %.2fx\n",
                  out_["throughput_ratio_at_baseline_reach_keep_attention"].get<double>());
    if (out_.contains("plan_worst_relative_difference"))
      std::printf("plan vs measured at the scheduled reach: worst component %.1f%%\n",
                  100 * out_["plan_worst_relative_difference"].get<double>());
    if (out_.contains("reach_ratio_vs_torch_fsdp2"))
      std::printf("vs PyTorch FSDP2: reach %.2fx, throughput %.2fx (%.2fx training as many sequences a step)\n",
                  out_["reach_ratio_vs_torch_fsdp2"].get<double>(), out_.value("throughput_ratio_vs_torch_fsdp2", 0.0),
                  out_.value("throughput_ratio_vs_torch_fsdp2_same_batch", 0.0));
  }

  const ReachFlags& f_;
  const std::int64_t budget_;
  const std::vector<Config> configs_;
  Runner runner_;
  nlohmann::json out_;
  // Per configuration (by its name in the JSON): its entry, its reach, its binding component
  // and the job at its reach.
  nlohmann::json per_config_ = nlohmann::json::object(), reach_ = nlohmann::json::object(),
                 binding_ = nlohmann::json::object();
  std::map<std::string, Trial> at_reach_;
};

int run_reach(const ReachFlags& f) { return Reach(f).run(); }

Command add_reach(CLI::App& parent) {
  auto f = std::make_shared<ReachFlags>();
  Command cmd;
  CLI::App* app = parent.add_subcommand(
      "reach", "Largest context within a device budget, by real training steps: baseline, each schedule, all four");
  cmd.app = app;
  text_flag(app, "--budget", f->budget, "Device budget per rank (the arena's capacity): 192MiB, 1GiB")
      ->capture_default_str();
  int_flag(app, "--ranks", f->ranks, "Ranks every job runs on (mpirun -np)", 1, 1 << 16);
  text_flag(app, "--model", f->model, "A preset or a Hugging Face config (as train's --model)")->capture_default_str();
  text_flag(app, "--precision", f->precision, "bf16 or f32: every job's train --precision")->capture_default_str();
  int_flag(app, "--cp", f->cp, "Context-parallel size (0 = all ranks split every sequence)", 0, 1 << 16);
  int_flag(app, "--ep", f->ep, "Expert-parallel size (0 = train's default)", 0, 1 << 16);
  int_flag(app, "--vocab-group", f->vocab_group, "Ranks sharing the LM head (0 = all)", 0, 1 << 16);
  text_flag(app, "--configs", f->configs,
            "Configurations: none, all, or schedules added to none (llep, dtp, sco, adam; several joined by '+': "
            "dtp+adam)")
      ->capture_default_str();
  int_flag(app, "--start", f->start, "First context tried", 8, std::int64_t{1} << 30);
  int_flag(app, "--max-context", f->max_context, "Doubling stops here", 8, std::int64_t{1} << 30);
  int_flag(app, "--multiple", f->multiple, "Every context tried is a multiple of this (>= 2 x cp)", 1, 1 << 20);
  real_flag(app, "--resolution", f->resolution, "Bisection stops at this fraction of the reach", 1e-4, 0.5);
  int_flag(app, "--trial-steps", f->trial_steps,
           "Steps per trial job: it fits when every step does (tokens/s from the steps after the first)", 1, 100);
  text_flag(app, "--mpirun", f->mpirun, "The launcher")->capture_default_str();
  text_flag(app, "--peer-json", f->peer_json, "bench/peer_fsdp2.py's output: compare with PyTorch FSDP2");
  text_flag(app, "--timeline-dir", f->timeline_dir,
            "Write the memory timelines of none and all at the baseline's reach here (none.rank-R.json, all...)");
  app->add_flag("--keep-attention", f->keep_attention,
                "At the baseline's reach also time the scheduled job with train's --keep-attention (the memory the "
                "schedules free spent on not recomputing the attention): its throughput ratio beside the plain one");
  device_flag(app, f->device);
  app->add_flag("--json", f->json, "Print one JSON object instead of the table (progress lines go to stderr)");
  cmd.validate = [f] {
    if (launcher_size() > 1)
      throw InvalidArgument("bench reach launches its own ranks (--ranks); run it without mpirun");
    // Everything a job or the comparison reads, checked before the first job (the search
    // takes minutes to hours).
    const std::vector<Config> configs = parse_configs(f->configs);
    const Precision precision = parse_precision(f->precision, "--precision");
    f->precision = std::string(precision_name(precision));  // as train spells it (bfloat16 -> bf16)
    const std::uint64_t budget = parse_bytes(f->budget, "--budget");
    const std::int64_t cp = f->cp > 0 ? f->cp : f->ranks;
    if (f->ranks % cp != 0) throw InvalidArgument("--cp " + std::to_string(cp) + " does not divide --ranks");
    check_context_split(cp, f->multiple, "--multiple");  // the smallest context tried
    if (f->start < f->multiple) throw InvalidArgument("--start must be at least --multiple");
    if (f->max_context < f->start) throw InvalidArgument("--max-context is below --start");
    const ModelConfig model = load_model_spec(f->model);
    check_trainable(model);
    const ParallelLayout layout = resolve_layout(f->ep, f->vocab_group, cp, model, f->ranks);
    if (!f->peer_json.empty()) (void)read_peer_json(f->peer_json, f->precision);
    if (!f->timeline_dir.empty()) check_timeline_dir(f->timeline_dir);
    if (f->ranks > 1) bench::require_program(f->mpirun, "--mpirun");
    // The smallest context the search tries is at least --multiple: below every
    // configuration's fixed state there, no job can fit.
    bench::check_reach_budget(budget, "--budget", model, layout, f->ranks, f->multiple, schedule_lists(configs),
                              precision);
  };
  cmd.run = [f] { return run_reach(*f); };
  return cmd;
}

const bool registered = register_command("bench", "reach", add_reach);

}  // namespace

}  // namespace peakbound::cli
