// `peakbound verify checkpoint`: Selective Checkpoint Offload against the resident
// baseline over a grid of layer counts, prefetch depths and resident-layer counts
// (including L = 1 and L below the depth): outputs, the input gradient and every
// parameter gradient must be bitwise equal, and the measured checkpoint peaks (device
// and host) must be the footprint's. Exit code 1 if any case fails.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peakbound/cli/flags.h"
#include "peakbound/cli/checkpoint_flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/bench/checkpoint_run.h"

namespace peakbound::cli {

namespace {

// Small sizes of its own (a grid of 60 cases); the link default is CheckpointOptions'.
struct VerifyFlags {
  std::int64_t tokens = 64, hidden = 32, ffn = 0;
  double link_gbps = CheckpointOptions{}.link_gbps;
  std::string device = CheckpointRunConfig{}.device;
  bool json = false;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int run_verify(const VerifyFlags& f) {
  // Refuse bad options before the first case, naming the flags.
  with_checkpoint_flags([&] {
    CheckpointOptions o;
    o.link_gbps = f.link_gbps;
    validate_checkpoint_options(o);
    return 0;
  });
  nlohmann::json cases = nlohmann::json::array();
  int failed = 0;
  for (std::int64_t L : {1, 2, 3, 5, 8}) {
    CheckpointRunConfig c;
    c.layers = L;
    c.tokens = f.tokens;
    c.hidden = f.hidden;
    c.ffn = f.ffn;
    c.device = f.device;
    c.options.schedule = CheckpointSchedule::resident;
    CheckpointRun base(c);
    base.step();
    std::vector<std::int64_t> ks = {0, 1, L / 2, L};
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (std::int64_t D : {1, 2, 4})
      for (std::int64_t K : ks) {
        CheckpointRunConfig s = c;
        s.options.schedule = CheckpointSchedule::sco;
        s.options.prefetch_depth = D;
        s.options.resident_layers = K;
        s.options.link_gbps = f.link_gbps;
        CheckpointRun sco(s);
        sco.step();
        const bool equal = same_bits(base.output(), sco.output()) && same_bits(base.input_grad(), sco.input_grad()) &&
                           same_bits(base.param_grads(), sco.param_grads());
        const std::uint64_t peak = sco.device().arena().peak(Component::checkpoints);
        const std::uint64_t host_peak = sco.host().peak(Component::checkpoints);
        const Footprint fp = checkpoint_footprint(sco.stack().buffers());
        const bool as_planned = peak == fp.device_peak(Component::checkpoints) &&
                                host_peak == fp.host_peak(Component::checkpoints);
        failed += !(equal && as_planned);
        cases.push_back({{"layers", L},
                         {"prefetch_depth", D},
                         {"resident_layers", K},
                         {"offloaded_layers", sco.stack().placement().offloaded},
                         {"bitwise_equal", equal},
                         {"checkpoint_peak_bytes", peak},
                         {"checkpoint_host_peak_bytes", host_peak},
                         {"checkpoint_peak_as_planned", as_planned}});
      }
  }
  if (f.json) {
    nlohmann::json j = {{"verify", "checkpoint"},
                        {"tokens", f.tokens},
                        {"hidden", f.hidden},
                        {"link_gbps_emulated", f.link_gbps > 0 ? nlohmann::json(f.link_gbps) : nlohmann::json(nullptr)},
                        {"cases", cases},
                        {"failed", failed},
                        {"passed", failed == 0}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const auto& c : cases)
      if (!c["bitwise_equal"].get<bool>() || !c["checkpoint_peak_as_planned"].get<bool>())
        std::printf("FAIL %s\n", c.dump().c_str());
    std::printf("verify checkpoint: %zu cases, %d failed (sco vs resident, bitwise)\n", cases.size(), failed);
  }
  return failed == 0 ? 0 : 1;
}

Command add_verify_checkpoint(CLI::App& parent) {
  auto f = std::make_shared<VerifyFlags>();
  Command c;
  c.app = parent.add_subcommand("checkpoint", "SCO vs resident checkpoints over layers x prefetch depth x resident layers, bitwise");
  int_flag(c.app, "--tokens", f->tokens, "Tokens per step", 1, 1 << 20);
  int_flag(c.app, "--hidden", f->hidden, "Hidden size", 1, 1 << 14);
  int_flag(c.app, "--ffn", f->ffn, "MLP intermediate size; 0 = 8/3 hidden rounded up to 64", 0, 1 << 16);
  real_flag(c.app, "--link-gbps", f->link_gbps,
            "Emulate a host link of this many GB/s (at least " + CLI::detail::to_string(CheckpointOptions::kMinLinkGbps) +
                ") on the copy engine (slow copies stress ordering); 0 = off",
            0.0, 1e6);
  device_flag(c.app, f->device);
  c.app->add_flag("--json", f->json, "Print one JSON object");
  c.run = [f] { return run_verify(*f); };
  return c;
}

const bool registered = register_command("verify", "checkpoint", &add_verify_checkpoint);

}  // namespace

}  // namespace peakbound::cli
