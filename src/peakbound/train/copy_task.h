// The built-in copy task: a random segment followed by itself, generated
// deterministically from a seed. A sequence of S + 1 tokens is
//   BOS, r_1 ... r_n, SEP, r_1 ... r_n, filler   (n = (S - 1) / 2 random symbols)
// and every token of the second copy after its first is scored. The symbols are drawn
// uniformly from `symbols` ids, so a model that ignores the context cannot beat their
// entropy, log(symbols) nats; one that finds the first copy, n + 1 tokens back (half the
// sequence: thousands of tokens at long context), scores 0. The mechanism it needs is
// an induction head (attend to the token after the previous occurrence of the current
// one), which small transformers learn in minutes; it scores ~S/2 tokens per sequence
// where the key-value task scores S/12, so the signal is six times denser.
#pragma once

#include <cstdint>
#include <vector>

namespace peakbound {

struct CopyTask {
  std::int64_t vocab = 0;    // token ids used: [0, vocab)
  std::int64_t seq_len = 0;  // S: inputs per sequence
  std::int64_t symbols = 0;  // distinct random symbols (0 = vocab - 2)
  std::uint64_t seed = 1;

  static constexpr std::int32_t kBos = 0, kSep = 1, kFirstSymbol = 2;
  std::int64_t symbol_count() const { return symbols > 0 ? symbols : vocab - kFirstSymbol; }
  std::int64_t segment() const { return (seq_len - 1) / 2; }  // n

  // Throws InvalidArgument naming what does not fit.
  void validate() const;
  // log(symbol_count()): the blind bound on the scored tokens.
  double unigram_entropy() const;

  struct Sequence {
    std::vector<std::int32_t> inputs;   // [S]
    std::vector<std::int32_t> targets;  // [S]; ignore_index where not scored
  };
  Sequence sequence(std::int64_t index, std::int32_t ignore_index = -100) const;
};

}  // namespace peakbound
