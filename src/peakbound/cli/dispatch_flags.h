// The shape flags shared by `bench dispatch` and `verify dispatch`.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/core/error.h"
#include "peakbound/verify/moe_reference.h"

namespace peakbound::cli {

struct DispatchFlags {
  std::int64_t tokens = 2048;  // per rank
  std::int64_t hidden = 128;
  std::int64_t ffn = 256;
  std::int64_t experts = 16;
  std::int64_t top_k = 2;
  std::string skew = "uniform,hot";
  double zipf_s = 1.2;
  std::int64_t cap = 512;
  double alpha = 1.0;
  double lambda = 1.3;
  std::int64_t min_spill = 64;
  std::uint64_t seed = 1;
  bool json = false;

  void add_to(CLI::App& app) {
    app.add_option("--tokens", tokens, "Tokens per rank")->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 28));
    app.add_option("--hidden", hidden, "Hidden size")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--ffn", ffn, "Expert FFN width")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--experts", experts, "Routed experts (divisible by the number of ranks)")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--topk", top_k, "Experts per token")->capture_default_str()->check(CLI::Range(1, 1 << 10));
    app.add_option("--skew", skew, "Comma list of uniform, zipf, hot, all-to-one-rank, one-expert, source")->capture_default_str();
    app.add_option("--zipf-s", zipf_s, "Zipf exponent")->capture_default_str();
    app.add_option("--cap", cap, "PipelinedLLEP: copies per source rank per round")->capture_default_str();
    app.add_option("--alpha", alpha, "LLEP capacity factor over the mean load")->capture_default_str();
    app.add_option("--lambda", lambda, "LLEP: imbalance below which standard EP runs")->capture_default_str();
    app.add_option("--min-spill", min_spill, "LLEP: smallest spilled piece, token-copies")->capture_default_str();
    app.add_option("--seed", seed, "Data seed")->capture_default_str();
    app.add_flag("--json", json, "Print one JSON object");
  }

  // Throws InvalidArgument for shapes the launched group cannot run.
  void check(int ranks) const {
    if (experts % ranks != 0)
      throw InvalidArgument("--experts " + std::to_string(experts) + " is not divisible by the " +
                            std::to_string(ranks) + " ranks");
    if (top_k > experts) throw InvalidArgument("--topk " + std::to_string(top_k) + " exceeds --experts " + std::to_string(experts));
  }

  LlepKnobs knobs() const {
    LlepKnobs k;
    k.alpha = alpha;
    k.lambda = lambda;
    k.min_spill = min_spill;
    k.cap = cap;
    return k;
  }

  std::vector<Skew> skews() const {
    std::vector<Skew> out;
    std::size_t start = 0;
    while (start <= skew.size()) {
      std::size_t comma = skew.find(',', start);
      out.push_back(parse_skew(skew.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
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
