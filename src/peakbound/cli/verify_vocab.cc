// `peakbound verify vocab`: the materialized baseline and Ring-DTP (auto, activations,
// weights) against a naive double-precision reference on the given shapes, over the
// launched group; exits 1 when any error exceeds the fp32 tolerance 1e-5.
#include <cstdio>
#include <memory>
#include <vector>
#include <nlohmann/json.hpp>

#include "peakbound/cli/command.h"
#include "peakbound/cli/vocab_flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"
#include "peakbound/verify/vocab_reference.h"

namespace peakbound::cli {

namespace {

constexpr double kTolerance = 1e-5;

Command add_verify_vocab(CLI::App& parent) {
  auto f = std::make_shared<VocabFlags>();
  f->tokens = 64;
  f->hidden = 32;
  f->vocab = 1000;
  f->chunk = 24;
  Command c;
  c.collective = true;  // every rank of the vocabulary group takes part
  c.app = parent.add_subcommand("vocab",
                                "Ring-DTP and the materialized baseline vs a naive reference (run under mpirun for P > 1); "
                                "small default shapes and chunk of its own, so several chunks and hops are exercised");
  f->add_to(*c.app);
  c.validate = [f] { f->options(); };  // every rank agrees: one line from rank 0, no abort
  c.run = [f] {
    auto world = world_communicator();
    Communicator& g = *world;
    VocabLossOptions o = f->options();  // refuses bad knobs before the reference is computed
    VocabProblemSpec spec;
    spec.tokens.assign(static_cast<std::size_t>(g.size()), f->tokens);
    spec.hidden = f->hidden;
    spec.vocab = f->vocab;
    spec.ignore_fraction = f->ignore_fraction;
    spec.seed = f->seed;
    VocabProblem p = make_vocab_problem(spec, o.ignore_index);
    const float scale = 1.0f;
    VocabReference ref = naive_vocab_reference(p, o, scale);
    // The device holds only the losses' own buffers (problem and reference are host
    // vectors): sized from the footprints of the four runs unless --device-memory says.
    VocabLossShape shape;
    shape.tokens = spec.tokens;
    shape.dims = f->dims();
    shape.rank = g.rank();
    std::vector<Footprint> fps = {materialized_vocab_footprint(shape, o, sizeof(float)),
                                  ring_dtp_footprint(shape, o, sizeof(float))};
    for (RingMode m : {RingMode::activations, RingMode::weights}) {
      VocabLossOptions om = o;
      om.mode = m;
      fps.push_back(ring_dtp_footprint(shape, om, sizeof(float)));
    }
    // Plus this rank's slice of the problem (check_vocab_loss puts it on the device).
    const VocabShard vs = vocab_shard(f->vocab, g.size(), g.rank());
    const std::int64_t T = spec.tokens[static_cast<std::size_t>(g.rank())];
    const std::uint64_t io = VocabRankOnDevice::bytes(T, f->hidden, vs.rows);
    std::unique_ptr<Device> device =
        make_device(f->device, f->device_budget(fps, io));
    std::unique_ptr<Communicator> gpu_group = device_group_for(*device, g);
    Communicator& group = gpu_group ? *gpu_group : g;
    Device& dev = *device;
    nlohmann::json runs = nlohmann::json::array();
    bool ok = true;
    for (auto [name, mode] : {std::pair{"materialized", RingMode::automatic}, {"ring_dtp", RingMode::automatic},
                              {"ring_dtp", RingMode::activations}, {"ring_dtp", RingMode::weights}}) {
      VocabLossOptions oo = o;
      if (std::string(name) == "ring_dtp" && f->mode == "auto") oo.mode = mode;
      auto impl = std::string(name) == "ring_dtp" ? make_ring_dtp_vocab_loss(dev, group, f->dims(), oo) : make_materialized_vocab_loss(dev, group, f->dims(), oo);
      VocabCheck chk = check_vocab_loss(*impl, g, p, ref, scale);
      bool pass = chk.count_matches && chk.rel_err_loss < kTolerance && chk.rel_err_dhidden < kTolerance &&
                  chk.rel_err_dweight < kTolerance;
      ok = ok && pass;
      runs.push_back({{"name", name}, {"requested", std::string(name) == "ring_dtp" ? std::string(ring_mode_name(oo.mode)) : ""},
                      {"mode", impl->mode_used()}, {"rel_err_loss", chk.rel_err_loss},
                      {"rel_err_dhidden", chk.rel_err_dhidden}, {"rel_err_dweight", chk.rel_err_dweight},
                      {"valid_tokens", chk.count}, {"pass", pass}});
      if (std::string(name) == "ring_dtp" && f->mode != "auto") break;  // a forced mode runs once
    }
    if (g.rank() == 0) {
      if (f->json) {
        nlohmann::json j = {{"ranks", g.size()}, {"tolerance", kTolerance}, {"runs", runs}, {"pass", ok}};
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        for (const auto& r : runs)
          std::printf("%-13s %-12s %-12s loss %.2e  dhidden %.2e  dweight %.2e  %s\n", r["name"].get<std::string>().c_str(),
                      r["requested"].get<std::string>().c_str(), r["mode"].get<std::string>().c_str(), r["rel_err_loss"].get<double>(),
                      r["rel_err_dhidden"].get<double>(), r["rel_err_dweight"].get<double>(),
                      r["pass"].get<bool>() ? "ok" : "MISMATCH");
        std::printf("%s (P = %d, tolerance %.0e relative)\n", ok ? "verify vocab: pass" : "verify vocab: FAIL", g.size(), kTolerance);
      }
    }
    return ok ? 0 : 1;
  };
  return c;
}

const bool registered = register_command("verify", "vocab", &add_verify_vocab);

}  // namespace

}  // namespace peakbound::cli
