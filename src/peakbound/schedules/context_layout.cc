#include "peakbound/schedules/context_layout.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

void check_context_split(std::int64_t cp, std::int64_t seq_len, std::string_view setting) {
  if (cp < 1) throw InvalidArgument("cp must be at least 1, got " + std::to_string(cp));
  if (cp > 1 && seq_len < 2 * cp)
    throw InvalidArgument("cp " + std::to_string(cp) + " splits every sequence into " + std::to_string(2 * cp) +
                          " chunks: " + std::string(setting) + " must be at least " + std::to_string(2 * cp) +
                          ", got " + std::to_string(seq_len));
}

CpChunk zigzag_chunk(std::int64_t S, int cp, int c) {
  if (S < 0) throw InvalidArgument("context layout: sequence length must be >= 0, got " + std::to_string(S));
  if (cp < 1) throw InvalidArgument("context layout: cp must be >= 1, got " + std::to_string(cp));
  const std::int64_t n = 2 * static_cast<std::int64_t>(cp);
  if (c < 0 || c >= n)
    throw InvalidArgument("context layout: chunk " + std::to_string(c) + " is outside [0, " + std::to_string(n) + ")");
  const std::int64_t base = S / n, extra = S % n;
  CpChunk k;
  k.len = base + (c < extra ? 1 : 0);
  k.begin = c * base + (c < extra ? c : extra);
  return k;
}

CpShard zigzag_shard(std::int64_t S, int cp, int rank) {
  if (cp >= 1 && (rank < 0 || rank >= cp))
    throw InvalidArgument("context layout: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(cp) +
                          ")");
  CpShard s;
  s.first = zigzag_chunk(S, cp, rank);
  s.second = zigzag_chunk(S, cp, 2 * cp - 1 - rank);
  return s;
}

int zigzag_widest_rank(std::int64_t S, int cp) {
  int widest = 0;
  for (int r = 1; r < cp; ++r)
    if (zigzag_shard(S, cp, r).tokens() > zigzag_shard(S, cp, widest).tokens()) widest = r;
  return widest;
}

std::int64_t zigzag_widest_tokens(std::int64_t S, int cp) { return zigzag_shard(S, cp, zigzag_widest_rank(S, cp)).tokens(); }

// The S mod 2cp extra tokens go to the first chunks, so the last chunk holds none of them.
std::int64_t zigzag_shortest_chunk(std::int64_t S, int cp) { return zigzag_chunk(S, cp, 2 * cp - 1).len; }

std::int64_t causal_pairs(const CpShard& s) {
  // Sum of (p + 1) over p in [b, b + len): len (2b + len + 1) / 2 per chunk.
  auto chunk = [](const CpChunk& k) { return k.len * (2 * k.begin + k.len + 1) / 2; };
  return chunk(s.first) + chunk(s.second);
}

}  // namespace peakbound
