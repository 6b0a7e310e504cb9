// The shape flags shared by `bench vocab` and `verify vocab`. The knobs' defaults are
// VocabLossOptions{}'s (one home); the shapes are the commands' own explicit sizes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "peakbound/cli/flags.h"

#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/units.h"
#include "peakbound/core/values.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound::cli {

struct VocabFlags {
  std::int64_t tokens = 4096;  // per rank
  std::int64_t hidden = 256;
  std::int64_t vocab = 16384;
  std::int64_t chunk = VocabLossOptions{}.chunk;
  std::string mode = std::string(ring_mode_name(VocabLossOptions{}.mode));
  float z_loss = VocabLossOptions{}.z_loss;
  double ignore_fraction = 0.0;
  std::uint64_t seed = 1;
  std::string device_memory = "auto";
  std::string device = "cpu";
  bool json = false;

  void add_to(CLI::App& app) {
    int_flag(&app, "--tokens", tokens, "Tokens per rank", 0, std::int64_t{1} << 30);
    int_flag(&app, "--hidden", hidden, "Hidden size", 1, 1 << 16);
    int_flag(&app, "--vocab", vocab, "Vocabulary size", 1, 1 << 24);
    int_flag(&app, "--chunk", chunk, "Ring-DTP token rows per logits block", 1, 1 << 24);
    app.add_option("--mode", mode, "Ring-DTP mode: auto, activations, weights")->capture_default_str();
    real_flag(&app, "--z-loss", z_loss, "z-loss coefficient", 0.0, 1.0);
    real_flag(&app, "--ignore-fraction", ignore_fraction, "Share of targets set to ignore_index", 0.0, 1.0);
    seed_flag(&app, "--seed", seed, "Data seed");
    app.add_option("--device-memory", device_memory,
                   "Per-rank device budget (e.g. 64MiB), or auto: the loss's footprint peak plus the rank's inputs and "
                   "gradients, plus 1/16 and 8 MiB")
        ->capture_default_str();
    device_flag(&app, device);
    app.add_flag("--json", json, "Print one JSON object");
  }

  VocabDims dims() const { return VocabDims{vocab, hidden}; }

  VocabLossOptions options() const {
    VocabLossOptions o;
    o.chunk = chunk;
    o.z_loss = z_loss;
    try {
      o.mode = parse_ring_mode(mode);
    } catch (const InvalidArgument&) {
      throw InvalidArgument("--mode '" + mode + "' is not auto, activations or weights");
    }
    validate(o);
    return o;
  }

  // An explicit --device-memory that cannot hold a footprint's peak fails on some rank
  // mid-run; refuse it up front, where every rank agrees (validate, before any collective).
  void check_budget(const std::vector<Footprint>& fps, int rank) const {
    if (device_memory == "auto") return;
    const std::uint64_t budget = parse_bytes(device_memory, "--device-memory");
    for (const Footprint& f : fps)
      if (f.device_peak_total() > budget)
        throw InvalidArgument("--device-memory " + device_memory + " cannot hold " + f.name() + "'s " +
                              format_bytes(static_cast<double>(f.device_peak_total())) + " of vocab buffers on rank " +
                              std::to_string(rank) + " (auto sizes it from the footprints)");
  }

  // The device budget for runs with these footprints: --device-memory, or auto:
  // auto_device_budget of the largest footprint peak, with `io` (the rank's inputs and
  // gradients on the device, outside the footprints) unplanned.
  std::uint64_t device_budget(const std::vector<Footprint>& fps, std::uint64_t io) const {
    if (device_memory != "auto") return parse_bytes(device_memory, "--device-memory");
    std::uint64_t peak = 0;
    for (const Footprint& f : fps) peak = std::max(peak, f.device_peak_total());
    return auto_device_budget(peak, io);
  }
};

}  // namespace peakbound::cli
