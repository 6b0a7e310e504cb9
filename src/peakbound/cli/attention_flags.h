// Flags shared by `verify attention` and `bench attention`: comma-separated integer
// lists (--lengths, --head-ratios, --windows, --cp-sizes), each item parsed exactly
// (core/values.h) with a one-line error naming the flag; and their one device budget.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/values.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound::cli {

// "1,2,4" -> {1, 2, 4}; every item in [lo, hi]; empty items refused.
inline std::vector<std::int64_t> int_list(const std::string& text, const std::string& flag, std::int64_t lo,
                                          std::int64_t hi) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_int(item, flag + " item", lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// The automatic device budget (auto_device_budget) of one rank of a ring attention run
// of `c` over `cp` ranks: the ring's footprint planned, and the caller's nine tensors
// (q, k, v, out, lse, dout, dq, dk, dv, each sized for the widest shard) unplanned.
inline std::uint64_t ring_attention_device_budget(const RingAttentionConfig& c, int cp, bool ulysses = false) {
  const auto& a = c.dims;
  std::int64_t T = 0;
  for (int r = 0; r < cp; ++r) T = std::max(T, zigzag_shard(c.seq_len, cp, r).tokens());
  std::uint64_t io = 0;
  for (std::int64_t w : {a.q_heads * a.qk_dim, a.kv_heads * a.qk_dim, a.kv_heads * a.v_dim, a.q_heads * a.v_dim,
                         a.q_heads, a.q_heads * a.v_dim, a.q_heads * a.qk_dim, a.kv_heads * a.qk_dim, a.kv_heads * a.v_dim})
    io = checked_add(io, arena_reserved(static_cast<std::uint64_t>(T * w) * sizeof(float)), "the attention tensors");
  return auto_device_budget(
      (ulysses ? ulysses_attention_footprint(c, cp) : ring_attention_footprint(c, cp)).device_peak_total(), io);
}

}  // namespace peakbound::cli
