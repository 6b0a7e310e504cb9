// `peakbound verify dispatch`: standard EP, LLEP and PipelinedLLEP against a dense
// double-precision reference on the given shapes and skews, over the launched group;
// exits 1 when any output or gradient is off by more than 1e-5 (relative).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "peakbound/cli/command.h"
#include "peakbound/cli/dispatch_flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/core/error.h"

namespace peakbound::cli {

namespace {

constexpr double kTolerance = 1e-5;

Command add_verify_dispatch(CLI::App& parent) {
  auto f = std::make_shared<DispatchFlags>();
  // The verify problem size: small enough for the dense reference, with a cap and a
  // smallest spill that split it into many rounds and pieces.
  f->tokens = 64;
  f->hidden = 16;
  f->ffn = 24;
  f->experts = 8;
  f->cap = 13;
  f->min_spill = 8;
  f->skew = "uniform,zipf,hot,all-to-one-rank,one-expert,source";
  Command c;
  c.collective = true;  // every rank of the vocabulary or expert-parallel group takes part
  c.app = parent.add_subcommand("dispatch", "Standard EP, LLEP, PipelinedLLEP vs a dense reference (run under mpirun for EP > 1)");
  f->add_to(*c.app, " (verify problem size; the library default is " + std::to_string(DispatchOptions{}.cap) + ")",
            " (verify problem size; the library default is " + std::to_string(DispatchOptions{}.min_spill) + ")");
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
    nlohmann::json runs = nlohmann::json::array();
    bool ok = true;
    for (Skew s : f->skews()) {
      MoeProblem p = make_moe_problem(f->spec(g.size(), s, f->tokens));
      MoeReference ref = dense_moe_reference(p);
      for (DispatchKind k : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
        std::unique_ptr<Device> dev = f->make_path_device(p, g.rank(), k);
        std::unique_ptr<Communicator> gpu_group = device_group_for(*dev, g);
        MoeDispatch d(*dev, gpu_group ? *gpu_group : g, p.spec.shape, k, f->options());
        MoeCheck chk = check_moe_dispatch(d, g, p, ref);
        bool pass = chk.max() < kTolerance;
        ok = ok && pass;
        runs.push_back({{"name", d.name()}, {"skew", skew_name(s)}, {"rounds", d.stats().rounds},
                        {"spilled", d.stats().spilled}, {"rel_err_y", chk.rel_err_y}, {"rel_err_dx", chk.rel_err_dx},
                        {"rel_err_dweights", chk.rel_err_dw}, {"rel_err_dexperts", chk.rel_err_dparams}, {"pass", pass}});
      }
    }
    if (g.rank() == 0) {
      if (f->json) {
        std::printf("%s\n", nlohmann::json({{"ranks", g.size()}, {"tolerance", kTolerance}, {"runs", runs}, {"pass", ok}}).dump(2).c_str());
      } else {
        for (const auto& r : runs)
          std::printf("%-15s %-16s rounds %3d  y %.1e  dx %.1e  dw %.1e  dW %.1e  %s\n", r["name"].get<std::string>().c_str(),
                      r["skew"].get<std::string>().c_str(), r["rounds"].get<int>(), r["rel_err_y"].get<double>(),
                      r["rel_err_dx"].get<double>(), r["rel_err_dweights"].get<double>(), r["rel_err_dexperts"].get<double>(),
                      r["pass"].get<bool>() ? "ok" : "MISMATCH");
        std::printf("%s (EP = %d, tolerance %.0e relative)\n", ok ? "verify dispatch: pass" : "verify dispatch: FAIL", g.size(), kTolerance);
      }
    }
    return ok ? 0 : 1;
  };
  return c;
}

const bool registered = register_command("verify", "dispatch", &add_verify_dispatch);

}  // namespace

}  // namespace peakbound::cli
