#include "peakbound/schedules/vocab_footprint.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

constexpr std::uint64_t kStatBytes = sizeof(float);           // logits and per-token statistics
constexpr std::uint64_t kTargetBytes = sizeof(std::int32_t);  // targets

std::uint64_t U(std::int64_t v) { return static_cast<std::uint64_t>(v); }

BufferSpec vocab(std::uint64_t count, std::uint64_t elem) { return buffer_spec(Component::vocab, count, elem); }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) { return checked_mul(a, b, "a vocab loss buffer"); }

void check(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  validate(o);
  validate(s.dims);
  if (s.tokens.empty()) throw InvalidArgument("vocab loss shape needs at least one rank's token count");
  if (s.rank < 0 || s.rank >= s.ranks())
    throw InvalidArgument("vocab loss rank " + std::to_string(s.rank) + " is outside the group of " +
                          std::to_string(s.ranks()));
  for (std::int64_t t : s.tokens)
    if (t < 0) throw InvalidArgument("vocab loss token count must be non-negative (got " + std::to_string(t) + ")");
  if (elem_bytes == 0) throw InvalidArgument("vocab loss elem_bytes must be positive");
}

}  // namespace

VocabLossShape VocabLossShape::uniform(std::int64_t tokens_per_rank, const VocabDims& dims, int ranks, int rank) {
  if (ranks < 1) throw InvalidArgument("vocab loss group must have at least one rank");
  VocabLossShape s;
  s.tokens.assign(static_cast<std::size_t>(ranks), tokens_per_rank);
  s.dims = dims;
  s.rank = rank;
  return s;
}

std::int64_t VocabLossShape::own_tokens() const { return tokens.at(static_cast<std::size_t>(rank)); }
std::int64_t VocabLossShape::max_tokens() const {
  return tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
}
std::int64_t VocabLossShape::total_tokens() const {
  std::uint64_t n = 0;
  for (std::int64_t t : tokens) n = checked_add(n, U(t), "the vocab group's tokens");
  return static_cast<std::int64_t>(n);
}

// ---- materialized -------------------------------------------------------------------

MaterializedVocabBuffers materialized_vocab_buffers(const VocabLossShape& s, const VocabLossOptions& o,
                                                    std::uint64_t elem_bytes) {
  check(s, o, elem_bytes);
  const std::uint64_t N = U(s.total_tokens()), H = U(s.dims.hidden);
  const std::uint64_t rows = U(vocab_shard(s.dims.vocab, s.ranks(), s.rank).rows);
  MaterializedVocabBuffers b;
  b.hidden_all = vocab(mul(N, H), elem_bytes);
  b.targets_all = vocab(N, kTargetBytes);
  b.logits = vocab(mul(N, rows), kStatBytes);
  b.lse = vocab(N, kStatBytes);
  b.row_sum = vocab(N, kStatBytes);
  b.target_logit = vocab(N, kStatBytes);
  b.d_hidden_all = vocab(mul(N, H), elem_bytes);
  return b;
}

Footprint materialized_vocab_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  const MaterializedVocabBuffers b = materialized_vocab_buffers(s, o, elem_bytes);
  Footprint f("vocab_materialized");
  for (const char* phase : {"forward", "saved", "backward"})
    f.device(phase, b.hidden_all).device(phase, b.targets_all).device(phase, b.logits).device(phase, b.lse);
  f.device("forward", b.row_sum).device("forward", b.target_logit);
  f.device("backward", b.d_hidden_all);
  return f;
}

// ---- Ring-DTP -----------------------------------------------------------------------

RingMode ring_dtp_mode(const VocabLossShape& s, const VocabLossOptions& o) {
  if (o.mode != RingMode::automatic) return o.mode;
  const std::int64_t rows_max = vocab_shard(s.dims.vocab, s.ranks(), 0).rows;  // shard 0 is never smaller
  return s.max_tokens() < rows_max ? RingMode::activations : RingMode::weights;
}

RingDtpBuffers ring_dtp_buffers(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  check(s, o, elem_bytes);
  const int P = s.ranks();
  const std::uint64_t T = U(s.own_tokens()), Tmax = U(s.max_tokens()), H = U(s.dims.hidden), chunk = U(o.chunk);
  const std::uint64_t rows_max = U(vocab_shard(s.dims.vocab, P, 0).rows);
  const std::uint64_t rows = U(vocab_shard(s.dims.vocab, P, s.rank).rows);
  RingDtpBuffers b;
  b.mode = ring_dtp_mode(s, o);
  b.lse = vocab(T, kStatBytes);
  if (ring_dtp_fuses(s)) b.fused_block = vocab(mul(std::min(chunk, T), U(s.dims.vocab)), kStatBytes);
  if (b.mode == RingMode::weights) {
    b.fwd_block = vocab(mul(std::min(chunk, T), rows_max), kStatBytes);
    b.fwd_stats = vocab(mul(3, T), kStatBytes);
    b.bwd_block = b.fwd_block;
    if (P > 1) {
      const BufferSpec shard = vocab(mul(rows_max, H), elem_bytes);
      b.fwd_lanes = {shard};
      b.bwd_lanes = {shard, shard};  // the shard and the dW accumulator travelling with it
      b.bwd_partial = shard;
    }
  } else {
    // A rank with no vocabulary rows (V < P) still gets a one-column block.
    b.fwd_block = vocab(mul(std::min(chunk, Tmax), std::max<std::uint64_t>(rows, 1)), kStatBytes);
    b.fwd_stats = vocab(mul(3, Tmax), kStatBytes);
    b.bwd_block = b.fwd_block;
    if (P > 1) {
      const BufferSpec hidden = vocab(mul(Tmax, H), elem_bytes);
      const BufferSpec targets = vocab(Tmax, kTargetBytes);
      b.fwd_lanes = {hidden, targets, vocab(mul(3, Tmax), kStatBytes)};
      b.bwd_lanes = {hidden, targets, vocab(Tmax, kStatBytes), hidden};
      b.bwd_partial = hidden;
    }
  }
  return b;
}

Footprint ring_dtp_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  const RingDtpBuffers b = ring_dtp_buffers(s, o, elem_bytes);
  Footprint f("ring_dtp/" + std::string(ring_mode_name(b.mode)));
  f.device("forward", b.lse).device("forward", b.fwd_block).device("forward", b.fwd_stats);
  for (const BufferSpec& l : b.fwd_lanes) f.device("forward", l, 2);
  f.device("saved", b.lse);
  f.device("backward", b.lse).device("backward", b.bwd_block).device("backward", b.bwd_partial);
  for (const BufferSpec& l : b.bwd_lanes) f.device("backward", l, 2);
  return f;
}

bool ring_dtp_fuses(const VocabLossShape& s) { return s.ranks() == 1; }

Footprint ring_dtp_step_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  if (!ring_dtp_fuses(s)) return ring_dtp_footprint(s, o, elem_bytes);
  const RingDtpBuffers b = ring_dtp_buffers(s, o, elem_bytes);
  Footprint f("ring_dtp/fused");
  f.device("forward_backward", b.fused_block);
  return f;
}

}  // namespace peakbound
