// The shape flags shared by `bench dispatch` and `verify dispatch`. Knob defaults come
// from DispatchOptions{} (the library's), unless a command sets its own problem size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/cli/flags.h"

#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/units.h"
#include "peakbound/core/values.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/verify/moe_reference.h"

namespace peakbound::cli {

struct DispatchFlags {
  std::int64_t tokens = 2048;  // per rank
  std::int64_t hidden = 128;
  std::int64_t ffn = 256;
  std::int64_t experts = 16;
  std::int64_t top_k = 2;
  std::string skew = "uniform,hot";
  double zipf_s = MoeProblemSpec{}.zipf_s;
  std::int64_t cap = DispatchOptions{}.cap;
  double alpha = DispatchOptions{}.alpha;
  double lambda = DispatchOptions{}.lambda;
  std::int64_t min_spill = DispatchOptions{}.min_spill;
  std::string round_budget = "off";  // off: DispatchOptions{}.round_bytes == 0, --cap decides
  std::int64_t max_lent = DispatchOptions{}.max_lent;
  std::uint64_t seed = 1;
  std::string device_memory = "auto";  // auto: sized from the dispatch footprints
  std::string device = "cpu";
  bool json = false;

  // `cap_help` / `min_spill_help` say where a command's own default comes from.
  void add_to(CLI::App& app, const std::string& cap_help = "", const std::string& min_spill_help = "") {
    int_flag(&app, "--tokens", tokens, "Tokens per rank", 0, std::int64_t{1} << 28);
    int_flag(&app, "--hidden", hidden, "Hidden size", 1, 1 << 16);
    int_flag(&app, "--ffn", ffn, "Expert FFN width", 1, 1 << 16);
    int_flag(&app, "--experts", experts, "Routed experts (divisible by the number of ranks)", 1, 1 << 16);
    int_flag(&app, "--topk", top_k, "Experts per token", 1, 1 << 10);
    app.add_option("--skew", skew, "Comma list of uniform, zipf, hot, all-to-one-rank, one-expert, source")->capture_default_str();
    real_flag(&app, "--zipf-s", zipf_s, "Zipf exponent", 0.0, 1e300);
    int_flag(&app, "--cap", cap, "PipelinedLLEP: copies per source rank per round" + cap_help, 1, kInt64Max);
    real_flag(&app, "--alpha", alpha, "LLEP capacity factor over the mean load", 1.0, 1e6);
    real_flag(&app, "--lambda", lambda, "LLEP: imbalance below which standard EP runs", 0.0, 1e6);
    app.add_option("--round-budget", round_budget,
                   "PipelinedLLEP: device memory the dispatch may use (e.g. 16MiB); its rounds are the fewest "
                   "that fit, replacing --cap; off: --cap decides")
        ->capture_default_str();
    int_flag(&app, "--max-lent", max_lent, "LLEP: most lent experts a rank holds (0: no bound)", 0, kInt64Max);
    int_flag(&app, "--min-spill", min_spill, "LLEP: smallest spilled piece, token-copies" + min_spill_help, 1, kInt64Max);
    seed_flag(&app, "--seed", seed, "Data seed");
    app.add_option("--device-memory", device_memory,
                   "Device budget of each path (e.g. 64MiB), or auto: its dispatch footprint's peak plus the rank's "
                   "inputs and outputs, plus 1/16 and 8 MiB")
        ->capture_default_str();
    device_flag(&app, device);
    app.add_flag("--json", json, "Print one JSON object");
  }

  // Throws InvalidArgument for shapes the launched group cannot run and knobs out of range.
  void check(int ranks) const {
    if (experts % ranks != 0)
      throw InvalidArgument("--experts " + std::to_string(experts) + " is not divisible by the " +
                            std::to_string(ranks) + " ranks");
    if (top_k > experts) throw InvalidArgument("--topk " + std::to_string(top_k) + " exceeds --experts " + std::to_string(experts));
    // The knobs' ranges (--cap, --alpha, --lambda, --min-spill, --zipf-s) are the flags'
    // own (cli/flags.h): only what depends on several flags or on the ranks is checked here.
    if (device_memory != "auto") parse_bytes(device_memory, "--device-memory");
    if (round_budget != "off") {
      // Below one copy sent and received per round no routing can run.
      const std::uint64_t b = round_bytes();
      DispatchSizes one;
      one.max_sent = one.max_received = 1;
      one.double_buffered = true;
      const std::uint64_t least = dispatch_peak_bytes(MoeShape{hidden, ffn, experts, top_k}, one, sizeof(float));
      if (b < least)
        throw InvalidArgument("--round-budget " + round_budget + " is below one copy per round (" +
                              std::to_string(least) + " bytes at this --hidden/--ffn)");
    }
  }

  // --round-budget in bytes, 0 for off.
  std::uint64_t round_bytes() const {
    if (round_budget == "off") return 0;
    const std::uint64_t b = parse_bytes(round_budget, "--round-budget");
    if (b == 0) throw InvalidArgument("--round-budget must be positive or off (got " + round_budget + ")");
    return b;
  }

  DispatchOptions options() const {
    DispatchOptions o;
    o.alpha = alpha;
    o.lambda = lambda;
    o.min_spill = min_spill;
    o.cap = cap;
    o.round_bytes = round_bytes();
    o.max_lent = max_lent;
    return o;
  }

  // The Arena budget of one path: --device-memory, or auto: auto_device_budget of its
  // footprint's peak, with the rank's slice of the problem on the device (MoeRankOnDevice)
  // unplanned.
  std::uint64_t budget(const MoeProblem& p, int rank, DispatchKind kind) const {
    if (device_memory != "auto") return parse_bytes(device_memory, "--device-memory");
    return auto_device_budget(moe_problem_footprint(p, rank, kind, options(), sizeof(float)).device_peak_total(),
                              MoeRankOnDevice::bytes(p, rank, p.spec.ranks));
  }

  // The device of one path (--device), with the budget above.
  std::unique_ptr<Device> make_path_device(const MoeProblem& p, int rank, DispatchKind kind) const {
    return make_device(device, budget(p, rank, kind));
  }

  std::vector<Skew> skews() const {
    std::vector<Skew> out;
    std::size_t start = 0;
    while (start <= skew.size()) {
      std::size_t comma = skew.find(',', start);
      try {
        out.push_back(parse_skew(skew.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string("--skew: ") + e.what());
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  MoeProblemSpec spec(int ranks, Skew s, std::int64_t tok) const {
    MoeProblemSpec p;
    p.shape = MoeShape{hidden, ffn, experts, top_k};
    p.ranks = ranks;
    p.tokens = tok;
    p.skew = s;
    p.zipf_s = zipf_s;
    p.seed = seed;
    return p;
  }
};

}  // namespace peakbound::cli
