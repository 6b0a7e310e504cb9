// `peakbound bench dispatch`: standard EP, LLEP and PipelinedLLEP on the same inputs in
// one run, for each requested routing skew (under mpirun: EP = the group size). For
// each path: the dispatch peak from its Arena (max over ranks), the forward+backward
// time (best of --reps after a warm-up, max over ranks), and the largest relative
// error of its outputs and gradients against standard EP. --sweep measures the peaks
// at 1, 2, 4 and 8x the tokens under each requested skew (with PipelinedLLEP's rounds).
// --round-budget sizes PipelinedLLEP's rounds from memory instead of --cap; each run
// reports its rounds and round_cap (copies a source sent per round).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/dispatch_flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
#include "peakbound/comm/device_communicator.h"

namespace peakbound::cli {

namespace {

struct BenchFlags : DispatchFlags {
  int reps = 2;
  bool sweep = false;
};

struct PathResult {
  std::string name;
  std::uint64_t peak = 0, budget = 0;  // max over ranks
  double seconds = 0;
  int rounds = 0;
  std::int64_t round_cap = 0;
  bool spilled = false;
  std::int64_t max_round_rows = 0, foreign_experts = 0;  // max over ranks
  std::vector<float> y, dx, dw, dparams;
};

PathResult run_path(const BenchFlags& f, Communicator& g, const MoeProblem& p, DispatchKind kind, bool timed) {
  const int r = g.rank();
  const std::uint64_t budget = f.budget(p, r, kind);
  std::unique_ptr<Device> dev = f.make_path_device(p, r, kind);
  std::unique_ptr<Communicator> gpu_group = device_group_for(*dev, g);
  MoeDispatch d(*dev, gpu_group ? *gpu_group : g, p.spec.shape, kind, f.options());
  MoeRankOnDevice on(*dev, p, r, g.size());
  PathResult out;
  out.name = d.name();
  auto step = [&] {
    on.forward(d);
    on.backward(d);
    dev->synchronize();
  };
  step();  // warm-up (and the run the peak is read from)
  if (timed) out.seconds = bench::best_group_seconds(g, step, f.reps);
  out.y = on.y();
  out.dx = on.dx();
  out.dw = on.dw();
  out.dparams = on.dparams();
  std::int64_t peak[2] = {static_cast<std::int64_t>(dev->arena().peak(Component::dispatch)),
                         static_cast<std::int64_t>(budget)};
  g.all_reduce(peak, 2, DType::i64, ReduceOp::max);
  out.peak = static_cast<std::uint64_t>(peak[0]);
  out.budget = static_cast<std::uint64_t>(peak[1]);
  out.rounds = d.stats().rounds;
  out.round_cap = d.stats().round_cap;
  std::int64_t mx[2] = {d.stats().max_received_rows, d.stats().foreign_experts};
  g.all_reduce(mx, 2, DType::i64, ReduceOp::max);
  out.max_round_rows = mx[0];
  out.foreign_experts = mx[1];
  out.spilled = d.stats().spilled;
  return out;
}

Command add_bench_dispatch(CLI::App& parent) {
  auto f = std::make_shared<BenchFlags>();
  Command c;
  c.collective = true;  // every rank of the vocabulary or expert-parallel group takes part
  c.app = parent.add_subcommand("dispatch", "Standard EP vs LLEP vs PipelinedLLEP: dispatch peak and throughput (run under mpirun)");
  f->add_to(*c.app, " (the library default)", " (the library default)");
  int_flag(c.app, "--reps", f->reps, "Timed repetitions after one warm-up (best is kept)", 1, 100);
  c.app->add_flag("--sweep", f->sweep, "Also measure the peaks at 1, 2, 4, 8x the tokens under each skew");
  // The launcher's group size is known before MPI starts: every rank reaches the same
  // verdict, so a bad shape is one line from rank 0 and a non-zero exit everywhere.
  c.validate = [f] {
    f->check(launcher_size());
    f->skews();
  };
  c.run = [f] {
    auto world = world_communicator();
    Communicator& g = *world;
    f->check(g.size());
    bench::share_cores_among_local_ranks();
    nlohmann::json runs = nlohmann::json::array(), per_skew = nlohmann::json::object();
    double worst_err = 0;
    for (Skew s : f->skews()) {
      MoeProblem p = make_moe_problem(f->spec(g.size(), s, f->tokens));
      std::int64_t all_tokens = 0;
      for (auto t : p.tokens) all_tokens += t;
      std::vector<PathResult> res;
      for (DispatchKind k : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep})
        res.push_back(run_path(*f, g, p, k, true));
      for (std::size_t i = 0; i < res.size(); ++i) {
        double err = 0;
        if (i > 0)
          err = std::max({bench::group_relative_error(g, res[i].y, res[0].y), bench::group_relative_error(g, res[i].dx, res[0].dx),
                          bench::group_relative_error(g, res[i].dw, res[0].dw), bench::group_relative_error(g, res[i].dparams, res[0].dparams)});
        worst_err = std::max(worst_err, err);
        runs.push_back({{"name", res[i].name}, {"skew", skew_name(s)}, {"dispatch_peak_bytes", res[i].peak},
                        {"device_budget_bytes", res[i].budget},
                        {"seconds", res[i].seconds}, {"tokens_per_second", static_cast<double>(all_tokens) / res[i].seconds},
                        {"rounds", res[i].rounds}, {"round_cap", res[i].round_cap}, {"spilled", res[i].spilled},
                        {"max_round_rows", res[i].max_round_rows}, {"lent_experts_held", res[i].foreign_experts}, {"max_rel_err_vs_standard", err}});
      }
      auto red = [](std::uint64_t a, std::uint64_t b) { return 1.0 - static_cast<double>(a) / static_cast<double>(b); };
      per_skew[std::string(skew_name(s))] = {{"peak_reduction_vs_standard", red(res[2].peak, res[0].peak)},
                                             {"peak_reduction_vs_llep", red(res[2].peak, res[1].peak)},
                                             {"throughput_ratio_vs_llep", res[1].seconds / res[2].seconds},
                                             {"throughput_ratio_vs_standard", res[0].seconds / res[2].seconds}};
    }
    nlohmann::json out = {{"bench", "dispatch"}, {"device", f->device}, {"ranks", g.size()}, {"tokens_per_rank", f->tokens},
                          {"hidden", f->hidden}, {"ffn", f->ffn}, {"experts", f->experts}, {"topk", f->top_k},
                          {"cap", f->cap}, {"round_budget", f->round_budget}, {"round_bytes", f->round_bytes()},
                          {"max_lent", f->max_lent}, {"alpha", f->alpha}, {"lambda", f->lambda}, {"min_spill", f->min_spill},
                          {"overlap", "pipelined_llep: round i+1 dispatch and round i-1 combine on a communication thread during round i compute"},
                          {"runs", runs}, {"skews", per_skew}, {"max_rel_err", worst_err},
                          {"machine", bench::machine_info()}};
    if (f->sweep) {
      nlohmann::json sweep = nlohmann::json::array(), spread = nlohmann::json::object();
      for (Skew s : f->skews()) {
        double lo = 1e300, hi = 0;
        for (double m : {1.0, 2.0, 4.0, 8.0}) {
          auto t = static_cast<std::int64_t>(static_cast<double>(f->tokens) * m);
          MoeProblem p = make_moe_problem(f->spec(g.size(), s, t));
          nlohmann::json row = {{"tokens_per_rank", t}, {"skew", skew_name(s)}};
          for (DispatchKind k : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
            PathResult pr = run_path(*f, g, p, k, false);
            row[std::string(dispatch_kind_name(k)) + "_peak_bytes"] = pr.peak;
            if (k == DispatchKind::pipelined_llep) {
              row["pipelined_llep_max_round_rows"] = pr.max_round_rows;
              row["pipelined_llep_rounds"] = pr.rounds;
              row["pipelined_llep_lent_experts_held"] = pr.foreign_experts;
              lo = std::min(lo, static_cast<double>(pr.peak));
              hi = std::max(hi, static_cast<double>(pr.peak));
            }
          }
          sweep.push_back(row);
        }
        spread[std::string(skew_name(s))] = hi / lo - 1.0;  // flat means under 0.10
      }
      out["sweep"] = sweep;
      out["pipelined_peak_spread"] = spread;
    }
    if (g.rank() == 0) std::printf("%s\n", out.dump(2).c_str());
    return 0;
  };
  return c;
}

const bool registered = register_command("bench", "dispatch", &add_bench_dispatch);

}  // namespace

}  // namespace peakbound::cli
