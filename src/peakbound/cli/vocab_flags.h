// The shape flags shared by `bench vocab` and `verify vocab`.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/schedules/vocab_loss.h"

namespace peakbound::cli {

struct VocabFlags {
  std::int64_t tokens = 4096;  // per rank
  std::int64_t hidden = 256;
  std::int64_t vocab = 16384;
  std::int64_t chunk = 256;
  std::string mode = "auto";
  float z_loss = 0.0f;
  double ignore_fraction = 0.0;
  std::uint64_t seed = 1;
  bool json = false;

  void add_to(CLI::App& app) {
    app.add_option("--tokens", tokens, "Tokens per rank")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
    app.add_option("--hidden", hidden, "Hidden size")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--vocab", vocab, "Vocabulary size")->capture_default_str()->check(CLI::Range(1, 1 << 24));
    app.add_option("--chunk", chunk, "Ring-DTP token rows per logits block")->capture_default_str()->check(CLI::Range(1, 1 << 24));
    app.add_option("--mode", mode, "Ring-DTP mode: auto, activations, weights")->capture_default_str();
    app.add_option("--z-loss", z_loss, "z-loss coefficient")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--ignore-fraction", ignore_fraction, "Share of targets set to ignore_index")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--seed", seed, "Data seed")->capture_default_str();
    app.add_flag("--json", json, "Print one JSON object");
  }

  VocabLossOptions options() const {
    VocabLossOptions o;
    o.vocab = vocab;
    o.hidden = hidden;
    o.chunk = chunk;
    o.z_loss = z_loss;
    o.mode = parse_ring_mode(mode);
    return o;
  }
};

}  // namespace peakbound::cli
