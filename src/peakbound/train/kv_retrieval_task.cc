#include "peakbound/train/kv_retrieval_task.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

KvRetrievalTask KvRetrievalTask::standard(std::int64_t vocab, std::int64_t seq_len, std::uint64_t seed,
                                          std::int64_t symbols) {
  KvRetrievalTask t;
  t.symbols = symbols;
  t.vocab = vocab;
  t.seq_len = seq_len;
  t.seed = seed;
  // Pairs fill at most a quarter of the sequence; the queries (3 tokens each) at most a
  // quarter too, so every pair lies at least S/2 tokens before its query.
  t.pairs = std::max<std::int64_t>(1, std::min(t.keys(), (seq_len - 1) / 8));
  t.queries = std::max<std::int64_t>(1, std::min(t.pairs, seq_len / 12));
  return t;
}

void KvRetrievalTask::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("kv retrieval task: " + what);
  };
  need(vocab >= 6, "vocab must be at least 6 (2 control tokens, 2 keys, 2 values), got " + std::to_string(vocab));
  need(symbols >= 0 && kFirstKey + 2 * symbols <= vocab,
       "symbols must be >= 0 with 2 + 2 x symbols <= vocab " + std::to_string(vocab) + ", got " +
           std::to_string(symbols));
  need(symbols != 1, "symbols must be 0 (the whole vocabulary) or at least 2, got 1");
  need(seq_len >= 8, "sequence length must be at least 8, got " + std::to_string(seq_len));
  need(pairs >= 1 && pairs <= keys(), "pairs must be in [1, " + std::to_string(keys()) + "] (distinct keys)");
  need(queries >= 1 && queries <= pairs, "queries must be in [1, pairs]");
  need(1 + 2 * pairs + 3 * queries <= seq_len + 1, "the pairs and queries do not fit in the sequence");
}

double KvRetrievalTask::unigram_entropy() const { return std::log(static_cast<double>(values())); }

KvRetrievalTask::Sequence KvRetrievalTask::sequence(std::int64_t index, std::int32_t ignore_index) const {
  validate();
  // One generator per sequence, seeded from (seed, index): any index in any order.
  std::seed_seq ss{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                   static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(static_cast<std::uint64_t>(index) >> 32)};
  std::mt19937_64 rng(ss);
  const std::int64_t n = seq_len + 1;  // inputs and targets overlap by S - 1 tokens
  std::vector<std::int32_t> tok(static_cast<std::size_t>(n));
  std::vector<bool> scored(static_cast<std::size_t>(n), false);
  std::uniform_int_distribution<std::int64_t> value(0, values() - 1);
  // Distinct keys: a partial Fisher-Yates shuffle of the key range.
  std::vector<std::int32_t> key_ids(static_cast<std::size_t>(keys()));
  std::iota(key_ids.begin(), key_ids.end(), kFirstKey);
  for (std::int64_t i = 0; i < pairs; ++i) {
    std::uniform_int_distribution<std::int64_t> pick(i, keys() - 1);
    std::swap(key_ids[static_cast<std::size_t>(i)], key_ids[static_cast<std::size_t>(pick(rng))]);
  }
  std::vector<std::int32_t> vals(static_cast<std::size_t>(pairs));
  tok[0] = kBos;
  for (std::int64_t i = 0; i < pairs; ++i) {
    vals[static_cast<std::size_t>(i)] = first_value() + static_cast<std::int32_t>(value(rng));
    tok[static_cast<std::size_t>(1 + 2 * i)] = key_ids[static_cast<std::size_t>(i)];
    tok[static_cast<std::size_t>(2 + 2 * i)] = vals[static_cast<std::size_t>(i)];
  }
  const std::int64_t query_start = n - 3 * queries;
  for (std::int64_t p = 1 + 2 * pairs; p < query_start; ++p)
    tok[static_cast<std::size_t>(p)] = first_value() + static_cast<std::int32_t>(value(rng));
  // Queries of distinct stored pairs, in random order.
  std::vector<std::int64_t> order(static_cast<std::size_t>(pairs));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  Sequence s;
  s.min_distance = n;
  for (std::int64_t q = 0; q < queries; ++q) {
    const std::int64_t pair = order[static_cast<std::size_t>(q)], at = query_start + 3 * q;
    tok[static_cast<std::size_t>(at)] = kQuery;
    tok[static_cast<std::size_t>(at + 1)] = key_ids[static_cast<std::size_t>(pair)];
    tok[static_cast<std::size_t>(at + 2)] = vals[static_cast<std::size_t>(pair)];
    scored[static_cast<std::size_t>(at + 2)] = true;
    s.min_distance = std::min(s.min_distance, (at + 2) - (2 + 2 * pair));
  }
  s.inputs.assign(tok.begin(), tok.end() - 1);
  s.targets.resize(static_cast<std::size_t>(seq_len));
  for (std::int64_t i = 0; i < seq_len; ++i)
    s.targets[static_cast<std::size_t>(i)] = scored[static_cast<std::size_t>(i + 1)] ? tok[static_cast<std::size_t>(i + 1)] : ignore_index;
  return s;
}

}  // namespace peakbound
