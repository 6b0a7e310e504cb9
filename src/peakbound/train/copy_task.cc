#include "peakbound/train/copy_task.h"

#include <cmath>
#include <random>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

void CopyTask::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("copy task: " + what);
  };
  need(vocab >= 4, "vocab must be at least 4 (2 control tokens, 2 symbols), got " + std::to_string(vocab));
  need(symbols == 0 || (symbols >= 2 && kFirstSymbol + symbols <= vocab),
       "symbols must be 0 (the whole vocabulary) or in [2, vocab - 2 = " + std::to_string(vocab - 2) + "], got " +
           std::to_string(symbols));
  need(seq_len >= 5, "sequence length must be at least 5, got " + std::to_string(seq_len));
}

double CopyTask::unigram_entropy() const { return std::log(static_cast<double>(symbol_count())); }

CopyTask::Sequence CopyTask::sequence(std::int64_t index, std::int32_t ignore_index) const {
  validate();
  std::seed_seq ss{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                   static_cast<std::uint32_t>(index),
                   static_cast<std::uint32_t>(static_cast<std::uint64_t>(index) >> 32), 0x636f7079u};
  std::mt19937_64 rng(ss);
  std::uniform_int_distribution<std::int64_t> sym(0, symbol_count() - 1);
  const std::int64_t n = segment(), total = seq_len + 1;
  std::vector<std::int32_t> tok(static_cast<std::size_t>(total), kSep);
  std::vector<bool> scored(static_cast<std::size_t>(total), false);
  tok[0] = kBos;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::int32_t>(kFirstSymbol + sym(rng));
    tok[static_cast<std::size_t>(1 + i)] = s;
    tok[static_cast<std::size_t>(2 + n + i)] = s;  // after SEP at 1 + n
    if (i > 0) scored[static_cast<std::size_t>(2 + n + i)] = true;
  }
  // Filler after the second copy (when S is even): random symbols, not scored.
  for (std::int64_t p = 2 + 2 * n; p < total; ++p) tok[static_cast<std::size_t>(p)] = static_cast<std::int32_t>(kFirstSymbol + sym(rng));
  Sequence s;
  s.inputs.assign(tok.begin(), tok.end() - 1);
  s.targets.resize(static_cast<std::size_t>(seq_len));
  for (std::int64_t i = 0; i < seq_len; ++i)
    s.targets[static_cast<std::size_t>(i)] =
        scored[static_cast<std::size_t>(i + 1)] ? tok[static_cast<std::size_t>(i + 1)] : ignore_index;
  return s;
}

}  // namespace peakbound
