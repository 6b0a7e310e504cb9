// The context-parallel layout of a sequence (issue 12's first piece): how CP ranks split
// every sequence so that causal attention costs each of them the same. Zigzag, as
// ring-flash-attention and Megatron-LM lay it out: the S tokens are cut into 2 x CP
// chunks and rank i holds chunks i and 2CP-1-i, an early chunk (few keys before it) and a
// late one (many), so every rank's queries see the same number of keys in total.
//
// Lengths that 2 x CP does not divide are cut into uneven chunks: the first S % 2CP
// chunks get one token more. Every token is held once, nothing is padded and no mask
// is needed; the work per rank then differs by a few rows of keys (at most 4 (S + 2CP)
// query-key pairs, 0.6% of a rank's work at S = 1001, CP = 3).
//
// A pure placement function: the executors (ring attention, RoPE at global positions,
// the loss over local tokens) take these ranges; tests check the partition and balance.
#pragma once

#include <cstdint>
#include <string_view>

namespace peakbound {

struct CpChunk {
  std::int64_t begin = 0;  // global position of the chunk's first token
  std::int64_t len = 0;
};

// What one rank holds of one sequence: two chunks, the early one first. Local token t
// (0 <= t < tokens()) is global position first.begin + t, or second.begin + t - first.len.
struct CpShard {
  CpChunk first, second;
  std::int64_t tokens() const { return first.len + second.len; }
  std::int64_t position(std::int64_t t) const { return t < first.len ? first.begin + t : second.begin + t - first.len; }
};

// The one rule of the split: with cp > 1 every sequence must hold at least 2 cp tokens
// (every zigzag chunk non-empty). InvalidArgument naming `setting` (how the caller spells
// the sequence length: "seq_len", "--seq-len") otherwise; cp < 1 is refused too.
void check_context_split(std::int64_t cp, std::int64_t seq_len, std::string_view setting = "seq_len");

// Chunk c (0 <= c < 2 cp) of an S-token sequence. Throws InvalidArgument for S < 0,
// cp < 1 or c outside [0, 2 cp).
CpChunk zigzag_chunk(std::int64_t S, int cp, int c);
// Rank `rank`'s shard: chunks rank and 2 cp - 1 - rank. InvalidArgument for a rank
// outside [0, cp).
CpShard zigzag_shard(std::int64_t S, int cp, int rank);
// The rank whose shard holds the most tokens (the lowest such rank; not always rank 0: with
// S mod 2cp = 2cp - 1 the middle ranks take two extra tokens), and that many tokens: what
// every rank's buffers are sized for. InvalidArgument as zigzag_shard.
int zigzag_widest_rank(std::int64_t S, int cp);
std::int64_t zigzag_widest_tokens(std::int64_t S, int cp);
// The fewest tokens any of the 2 cp chunks holds (floor(S / 2cp): the pieces of a shard's
// rows are at most this many, so that every piece of every chunk is non-empty).
// InvalidArgument as zigzag_chunk.
std::int64_t zigzag_shortest_chunk(std::int64_t S, int cp);
// The causal attention work of a shard: the number of (query, key) pairs with
// key <= query over its tokens, sum of (position + 1).
std::int64_t causal_pairs(const CpShard& s);

}  // namespace peakbound
