// `peakbound bench all`: every component benchmark at its default shape, each as its own job
// (the multi-rank ones under `mpirun -np --ranks`, the others as one process), and one table
// and one JSON document with every ratio beside its target, the machine and the thread/rank
// layout. The README's performance table is this table. Run it without mpirun: it launches
// its own jobs. `--repeat N` runs the whole suite N times, round after round, and gives each
// figure as the median with the spread (min, max) and in how many runs it met its bar, so a
// figure is never one lucky run. `--with-reach` adds `bench reach` once (tens of minutes on
// a small machine).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/bench/harness.h"
#include "peakbound/bench/reach_budget.h"
#include "peakbound/bench/subprocess.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/train/model_spec.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound::cli {

namespace {

struct AllFlags {
  int ranks = 4;
  std::string benches = "vocab,dispatch,checkpoint,optimizer,attention";
  std::string mpirun = "mpirun";
  int repeat = 1;
  bool with_reach = false;
  std::string reach_budget = "192MiB";
  bool json = false;
};

// A benchmark of the suite: the `bench` subcommand it runs (its name unless said), whether
// it runs on --ranks ranks, and the flags it runs with beyond its defaults: checkpoint at 16
// layers (the depth issue 15's SCO bar is set at), dispatch with a 16 MiB round budget
// (PipelinedLLEP's rounds sized from memory, not the fixed cap), and vocab once more on one
// rank (Ring-DTP's fused form is the one-rank group's).
struct Suite {
  std::string name;
  bool multi_rank;
  std::vector<std::string> args;
  std::string command;  // empty: name
};

const std::vector<Suite>& suites() {
  static const std::vector<Suite> s = {{"vocab", true, {}, ""},
                                       {"vocab_1rank", false, {}, "vocab"},
                                       {"dispatch", true, {"--round-budget", "16MiB"}, ""},
                                       {"checkpoint", false, {"--layers", "16"}, ""},
                                       {"optimizer", false, {}, ""},
                                       {"attention", true, {}, ""},
                                       {"reach", false, {}, ""}};
  return s;
}

const Suite& suite(const std::string& name) {
  for (const Suite& s : suites())
    if (s.name == name) return s;
  throw InvalidArgument("--benches: '" + name + "' is not one of vocab, dispatch, checkpoint, optimizer, attention");
}

// One figure of the table: a JSON pointer into the bench's document, and the bar it is held
// to (`at_least`; none for a figure reported without one) with where the bar comes from.
struct Figure {
  std::string bench, metric, pointer;
  double at_least = -1;
  std::string bar_source;
};

const std::vector<Figure>& figures() {
  static const std::vector<Figure> f = {
      {"vocab", "peak_reduction", "/peak_reduction", 0.866, "published 86.6%"},
      {"vocab", "throughput_ratio", "/throughput_ratio", 0.72, "4-GEMM limit 0.75 (issue 15)"},
      {"vocab", "gemm_gflops ring / baseline", "/gemm_gflops_ratio", -1, ""},
      {"vocab_1rank", "fused throughput_ratio (1 rank)", "/throughput_ratio", 1.0, "issue 15 (3 GEMMs, no recompute)"},
      {"vocab_1rank", "fused peak_reduction (1 rank)", "/peak_reduction", -1, ""},
      {"dispatch", "hot: peak_reduction_vs_standard", "/skews/hot/peak_reduction_vs_standard", 0.593,
       "published up to 59.3%"},
      {"dispatch", "hot: peak_reduction_vs_llep", "/skews/hot/peak_reduction_vs_llep", -1, ""},
      {"dispatch", "uniform: throughput_ratio_vs_llep", "/skews/uniform/throughput_ratio_vs_llep", 0.95,
       "issue 15"},
      {"dispatch", "hot: throughput_ratio_vs_llep", "/skews/hot/throughput_ratio_vs_llep", 0.95, "issue 15"},
      {"dispatch", "hot: throughput_ratio_vs_standard", "/skews/hot/throughput_ratio_vs_standard", -1, ""},
      {"checkpoint", "checkpoint_peak_reduction", "/checkpoint_peak_reduction", -1, ""},
      {"checkpoint", "throughput_ratio", "/throughput_ratio", 0.95, "issue 15"},
      {"optimizer", "speedup_stream_vs_serial", "/speedup_stream_vs_serial", 1.0,
       "issue 15 here (published 2.05 with PCIe copies)"},
      {"optimizer", "roofline_fraction", "/roofline_fraction", 0.7, "the bench's own bar"},
      {"attention", "peak_bytes cp 2 / cp 1", "", -1, ""},
      {"attention", "peak_bytes cp 4 / cp 1", "", -1, ""},
      {"attention", "overlap_fraction cp 4", "/overlap_fraction/4", -1, ""},
      {"reach", "reach_ratio", "/reach_ratio", 8, "issue 14 (published 8-32x)"},
      {"reach", "throughput_ratio_at_baseline_reach", "/throughput_ratio_at_baseline_reach", 1.0, "issue 14"},
  };
  return f;
}

// The figure's value in the bench's document, or null when the document lacks it.
nlohmann::json value_of(const Figure& f, const nlohmann::json& doc) {
  if (f.bench == "attention" && f.pointer.empty()) {
    const std::string cp = f.metric.find("cp 2") != std::string::npos ? "2" : "4";
    const nlohmann::json& p = doc.value("peak_bytes", nlohmann::json::object());
    if (!p.contains("1") || !p.contains(cp) || p["1"].get<double>() <= 0) return nullptr;
    return p[cp].get<double>() / p["1"].get<double>();
  }
  const nlohmann::json::json_pointer ptr(f.pointer);
  if (!doc.contains(ptr) || !doc[ptr].is_number()) return nullptr;
  return doc[ptr];
}

// A bench's output is one JSON document (possibly pretty-printed), maybe after text lines.
nlohmann::json parse_document(const std::string& out, const std::string& name) {
  const std::size_t brace = out.find("\n{");
  const std::string text = out.rfind('{', 0) == 0 ? out : (brace == std::string::npos ? "" : out.substr(brace + 1));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error("bench all: `bench " + name + " --json` printed no JSON document");
  }
}

int run_all(const AllFlags& f) {
  std::vector<std::string> names;
  std::stringstream ss(f.benches);
  for (std::string item; std::getline(ss, item, ',');) {
    names.push_back(item);
    if (item == "vocab") names.push_back("vocab_1rank");
  }
  if (f.with_reach) names.push_back("reach");
  const std::string exe = bench::self_executable();
  const unsigned hw = std::thread::hardware_concurrency();
  nlohmann::json out = {{"bench", "all"},
                        {"machine", bench::machine_info()},
                        {"layout",
                         {{"ranks", f.ranks},
                          {"hardware_threads", hw},
                          {"blas_threads_per_rank", std::max(1, static_cast<int>(hw) / f.ranks)},
                          {"blas_threads_single_process", static_cast<int>(hw)},
                          {"launcher", f.mpirun + " -np " + std::to_string(f.ranks) + " --oversubscribe"}}},
                        {"load_average_before", bench::load_average()}};
  // One job: the bench's JSON document.
  auto run_bench = [&](const std::string& name, nlohmann::json& seconds) {
    const Suite& su = suite(name);
    std::vector<std::string> argv;
    if (su.multi_rank) argv = bench::mpirun_argv(f.mpirun, f.ranks);
    argv.insert(argv.end(), {exe, "bench", su.command.empty() ? name : su.command, "--json"});
    argv.insert(argv.end(), su.args.begin(), su.args.end());
    if (name == "reach")
      argv.insert(argv.end(), {"--budget", f.reach_budget, "--ranks", std::to_string(f.ranks), "--mpirun", f.mpirun});
    bench::Stopwatch w;
    const bench::ProcessResult p = bench::run_process(argv);
    seconds[name] = seconds.value(name, 0.0) + w.seconds();
    if (p.exit_code != 0)
      throw Error("bench all: `bench " + name + "` failed (exit " + std::to_string(p.exit_code) +
                  "): " + bench::failure_reason(argv, p));
    return parse_document(p.out, name);
  };
  nlohmann::json args = nlohmann::json::object();
  for (const std::string& name : names) args[name] = suite(name).args;
  out["layout"]["repeat"] = f.repeat;
  out["bench_args"] = args;
  // Round after round, the whole suite each time (reach once, in the first round: it is a
  // search of tens of minutes, not a timing).
  nlohmann::json rounds = nlohmann::json::array(), seconds = nlohmann::json::object();
  for (int r = 0; r < f.repeat; ++r) {
    nlohmann::json results = nlohmann::json::object();
    for (const std::string& name : names) {
      if (name == "reach" && r > 0) continue;
      std::fprintf(stderr, "bench %s (run %d of %d) ...\n", name.c_str(), r + 1, f.repeat);
      results[name] = run_bench(name, seconds);
    }
    rounds.push_back(results);
  }
  out["load_average_after"] = bench::load_average();
  nlohmann::json table = nlohmann::json::array();
  for (const Figure& fig : figures()) {
    std::vector<double> values;
    bool present = false;
    for (const nlohmann::json& results : rounds) {
      if (!results.contains(fig.bench)) continue;
      present = true;
      const nlohmann::json v = value_of(fig, results[fig.bench]);
      if (v.is_number()) values.push_back(v.get<double>());
    }
    if (!present) continue;
    nlohmann::json row = {{"bench", fig.bench}, {"metric", fig.metric}, {"values", values}};
    std::vector<double> sorted = values;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty()) {
      row["value"] = nullptr;
    } else {
      // The median (the lower middle of an even count: never an average nobody measured).
      row["value"] = sorted[(sorted.size() - 1) / 2];
      row["min"] = sorted.front();
      row["max"] = sorted.back();
    }
    if (fig.at_least >= 0) {
      const auto met = std::count_if(values.begin(), values.end(), [&](double v) { return v >= fig.at_least; });
      row["at_least"] = fig.at_least;
      row["bar"] = fig.bar_source;
      row["met_runs"] = met;
      row["runs"] = values.size();
      row["met"] = !values.empty() && met == static_cast<std::ptrdiff_t>(values.size());  // in every run
    }
    table.push_back(row);
  }
  out["figures"] = table;
  out["seconds"] = seconds;
  out["results"] = rounds[0];  // the first run's documents (every run's under "runs")
  if (f.repeat > 1) out["runs"] = rounds;
  if (f.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("peakbound bench all: %d ranks for the multi-rank benches, %u hardware threads, %d run%s, load %s -> %s\n",
              f.ranks, hw, f.repeat, f.repeat == 1 ? "" : "s", out["load_average_before"].get<std::string>().c_str(),
              out["load_average_after"].get<std::string>().c_str());
  auto num = [](const nlohmann::json& v) { return v.is_number() ? std::to_string(v.get<double>()).substr(0, 5) : std::string("-"); };
  std::printf("%-11s %-36s %7s %13s %10s  %s\n", "bench", "figure", "median", "min-max", "bar", "");
  for (const nlohmann::json& r : table) {
    const std::string spread = r.contains("min") ? num(r["min"]) + "-" + num(r["max"]) : "-";
    const std::string bar = r.contains("at_least") ? ">= " + num(r["at_least"]) : "";
    std::string met;
    if (r.contains("met"))
      met = (r["met"].get<bool>() ? "met" : "NOT met") +
            (f.repeat > 1 ? " in " + std::to_string(r["met_runs"].get<int>()) + " of " + std::to_string(r["runs"].get<int>()) : "");
    std::printf("%-11s %-36s %7s %13s %10s  %s\n", r["bench"].get<std::string>().c_str(),
                r["metric"].get<std::string>().c_str(), num(r["value"]).c_str(), spread.c_str(), bar.c_str(), met.c_str());
  }
  return 0;
}

Command add_all(CLI::App& parent) {
  auto f = std::make_shared<AllFlags>();
  Command cmd;
  CLI::App* app = parent.add_subcommand(
      "all", "Every component benchmark at its default shape, each as its own job: one table of every ratio");
  cmd.app = app;
  int_flag(app, "--ranks", f->ranks, "Ranks of the multi-rank benches (vocab, dispatch, attention)", 1, 1 << 16);
  text_flag(app, "--benches", f->benches, "Which benches (vocab, dispatch, checkpoint, optimizer, attention)")
      ->capture_default_str();
  text_flag(app, "--mpirun", f->mpirun, "The launcher")->capture_default_str();
  int_flag(app, "--repeat", f->repeat, "Runs of the whole suite: each figure as its median, min-max and runs that met the bar", 1, 1000);
  app->add_flag("--with-reach", f->with_reach, "Also run `bench reach` (tens of minutes on a small machine)");
  text_flag(app, "--reach-budget", f->reach_budget, "bench reach's --budget")->capture_default_str();
  app->add_flag("--json", f->json, "Print one JSON document (figures, layout, every bench's own document)");
  cmd.validate = [f] {
    if (launcher_size() > 1) throw InvalidArgument("bench all launches its own jobs (--ranks); run it without mpirun");
    std::stringstream ss(f->benches);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item == "reach")  // a search, not a component bench: --with-reach adds it
        throw InvalidArgument("--benches: 'reach' is not one of vocab, dispatch, checkpoint, optimizer, attention (use --with-reach)");
      suite(item);  // throws for a name it does not know
    }
    if (f->ranks > 1) bench::require_program(f->mpirun, "--mpirun");
    // --with-reach: bench reach's budget checked now, not after the whole suite (its
    // own flags at their defaults: tiny-moe, cp over every rank, contexts from 64).
    const std::uint64_t reach_budget = parse_bytes(f->reach_budget, "--reach-budget");
    if (f->with_reach) {
      if (f->ranks > 32)
        throw InvalidArgument("--with-reach: bench reach splits every context over --ranks " + std::to_string(f->ranks) +
                              " and starts at 64 tokens, which needs --ranks at most 32");
      const ModelConfig model = load_model_spec("tiny-moe");
      const ParallelLayout layout = resolve_layout(0, 0, f->ranks, model, f->ranks);
      bench::check_reach_budget(reach_budget, "--reach-budget", model, layout, f->ranks, 64,
                                {"none", "llep", "dtp", "sco", "adam", "all"});
    }
  };
  cmd.run = [f] { return run_all(*f); };
  return cmd;
}

const bool registered = register_command("bench", "all", add_all);

}  // namespace

}  // namespace peakbound::cli
