// The built-in long-context task: key-value retrieval, generated deterministically
// from a seed. A sequence of S + 1 tokens is
//   BOS, k1 v1 k2 v2 ... kn vn   (n pairs, keys distinct)
//   filler ...                   (random value-range tokens, never scored)
//   QRY k v  QRY k v ...         (queries of stored keys, at the end)
// and only the value after each queried key is scored. Values are drawn uniformly from
// `values` symbols, so a model that ignores the context cannot beat their unigram
// entropy, log(values) nats; one that finds the pair, at least S/2 tokens back, scores 0.
#pragma once

#include <cstdint>
#include <vector>

namespace peakbound {

struct KvRetrievalTask {
  std::int64_t vocab = 0;        // token ids used: [0, vocab)
  std::int64_t seq_len = 0;      // S: inputs per sequence (targets are the next S tokens)
  std::int64_t pairs = 0;        // n stored pairs (<= the key range, fits in the first half)
  std::int64_t queries = 0;      // scored values per sequence (<= pairs)
  std::uint64_t seed = 1;
  // Distinct keys and distinct values drawn (each); 0 = split the whole vocabulary.
  // Fewer symbols make a task a small model learns in minutes (the unigram entropy of
  // the scored values is log(values())); the ids stay in [0, vocab).
  std::int64_t symbols = 0;

  static constexpr std::int32_t kBos = 0, kQuery = 1;
  static constexpr std::int32_t kFirstKey = 2;
  // Keys take [2, 2 + keys()), values the next values() ids.
  std::int64_t keys() const { return symbols > 0 ? symbols : (vocab - kFirstKey) / 2; }
  std::int64_t values() const { return symbols > 0 ? symbols : vocab - kFirstKey - keys(); }
  std::int32_t first_value() const { return static_cast<std::int32_t>(kFirstKey + keys()); }

  // A task for a vocabulary and length with as many pairs as fit (and half as many queries).
  static KvRetrievalTask standard(std::int64_t vocab, std::int64_t seq_len, std::uint64_t seed,
                                  std::int64_t symbols = 0);
  // Throws InvalidArgument naming what does not fit.
  void validate() const;
  // Nats a context-blind model cannot beat on the scored tokens: log(values()).
  double unigram_entropy() const;

  struct Sequence {
    std::vector<std::int32_t> inputs;   // [S]
    std::vector<std::int32_t> targets;  // [S]; ignore_index where not scored
    std::int64_t min_distance = 0;      // fewest tokens between a scored value and its pair
  };
  // Sequence `index` of the stream (any index; the same index gives the same tokens).
  Sequence sequence(std::int64_t index, std::int32_t ignore_index = -100) const;
};

}  // namespace peakbound
