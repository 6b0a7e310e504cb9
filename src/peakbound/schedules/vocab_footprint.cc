#include "peakbound/schedules/vocab_footprint.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/nn/linear.h"

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

// Bytes of the [*, H] tensors: carried/stored (`act`) and accumulated (`acc`); `bf16`
// adds the narrowing buffers.
struct Elems {
  std::uint64_t act, acc;
  bool bf16;
};
Elems estimate(std::uint64_t elem_bytes) { return {elem_bytes, elem_bytes, false}; }
Elems runtime(Precision p) {
  if (p == Precision::bf16) return {sizeof(bf16), sizeof(float), true};
  return {sizeof(float), sizeof(float), false};
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

namespace {

MaterializedVocabBuffers materialized(const VocabLossShape& s, const VocabLossOptions& o, Elems e) {
  check(s, o, e.act);
  const std::uint64_t N = U(s.total_tokens()), H = U(s.dims.hidden), T = U(s.own_tokens());
  const std::uint64_t rows = U(vocab_shard(s.dims.vocab, s.ranks(), s.rank).rows);
  const bool uniform = std::all_of(s.tokens.begin(), s.tokens.end(), [&](std::int64_t t) { return t == s.tokens[0]; });
  MaterializedVocabBuffers b;
  b.hidden_all = vocab(mul(N, H), e.act);
  b.targets_all = vocab(N, kTargetBytes);
  b.logits = vocab(mul(N, rows), kStatBytes);
  b.lse = vocab(N, kStatBytes);
  b.row_sum = vocab(N, kStatBytes);
  b.target_logit = vocab(N, kStatBytes);
  b.d_hidden_all = vocab(mul(N, H), e.acc);
  b.g16 = vocab(e.bf16 ? mul(std::min(N, U(kLinearTileRows)), rows) : 0, sizeof(bf16));
  b.d_hidden32 = vocab(e.bf16 && uniform ? mul(T, H) : 0, sizeof(float));
  return b;
}

Footprint materialized_footprint(const MaterializedVocabBuffers& b) {
  Footprint f("vocab_materialized");
  for (const char* phase : {"forward", "saved", "backward"})
    f.device(phase, b.hidden_all).device(phase, b.targets_all).device(phase, b.logits).device(phase, b.lse);
  f.device("forward", b.row_sum).device("forward", b.target_logit);
  f.device("backward", b.d_hidden_all).device("backward", b.g16).device("backward", b.d_hidden32);
  return f;
}

}  // namespace

MaterializedVocabBuffers materialized_vocab_buffers(const VocabLossShape& s, const VocabLossOptions& o,
                                                    std::uint64_t elem_bytes) {
  return materialized(s, o, estimate(elem_bytes));
}

MaterializedVocabBuffers materialized_vocab_buffers(const VocabLossShape& s, const VocabLossOptions& o, Precision p) {
  return materialized(s, o, runtime(p));
}

Footprint materialized_vocab_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  return materialized_footprint(materialized_vocab_buffers(s, o, elem_bytes));
}

Footprint materialized_vocab_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p) {
  return materialized_footprint(materialized_vocab_buffers(s, o, p));
}

// ---- Ring-DTP -----------------------------------------------------------------------

RingMode ring_dtp_mode(const VocabLossShape& s, const VocabLossOptions& o) {
  if (o.mode != RingMode::automatic) return o.mode;
  const std::int64_t rows_max = vocab_shard(s.dims.vocab, s.ranks(), 0).rows;  // shard 0 is never smaller
  return s.max_tokens() < rows_max ? RingMode::activations : RingMode::weights;
}

namespace {

RingDtpBuffers ring_dtp(const VocabLossShape& s, const VocabLossOptions& o, Elems e) {
  check(s, o, e.act);
  const int P = s.ranks();
  const std::uint64_t T = U(s.own_tokens()), Tmax = U(s.max_tokens()), H = U(s.dims.hidden), chunk = U(o.chunk);
  const std::uint64_t rows_max = U(vocab_shard(s.dims.vocab, P, 0).rows);
  const std::uint64_t rows = U(vocab_shard(s.dims.vocab, P, s.rank).rows);
  const std::uint64_t narrow = e.bf16 ? 1 : 0;  // the bf16-only buffers' element factor
  RingDtpBuffers b;
  b.mode = ring_dtp_mode(s, o);
  b.lse = vocab(T, kStatBytes);
  b.fused_block = vocab(0, kStatBytes);
  b.fused_g16 = vocab(0, sizeof(bf16));
  if (ring_dtp_fuses(s)) {
    b.fused_block = vocab(mul(std::min(chunk, T), U(s.dims.vocab)), kStatBytes);
    b.fused_g16 = vocab(narrow * mul(std::min(chunk, T), U(s.dims.vocab)), sizeof(bf16));
  }
  b.dx_tile = vocab(P == 1 ? narrow * mul(std::min(chunk, T), H) : 0, sizeof(float));
  b.d_hidden32 = vocab(0, sizeof(float));
  if (b.mode == RingMode::weights) {
    b.fwd_block = vocab(mul(std::min(chunk, T), rows_max), kStatBytes);
    b.fwd_stats = vocab(mul(3, T), kStatBytes);
    b.bwd_block = b.fwd_block;
    b.g16 = vocab(narrow * mul(std::min(chunk, T), rows_max), sizeof(bf16));
    if (P > 1) {
      const BufferSpec shard = vocab(mul(rows_max, H), e.act), grad = vocab(mul(rows_max, H), e.acc);
      b.fwd_lanes = {shard};
      b.bwd_lanes = {shard, grad};  // the shard and the dW accumulator travelling with it
      b.bwd_partial = grad;
      b.d_hidden32 = vocab(narrow * mul(T, H), sizeof(float));
    }
  } else {
    // A rank with no vocabulary rows (V < P) still gets a one-column block.
    b.fwd_block = vocab(mul(std::min(chunk, Tmax), std::max<std::uint64_t>(rows, 1)), kStatBytes);
    b.fwd_stats = vocab(mul(3, Tmax), kStatBytes);
    b.bwd_block = b.fwd_block;
    b.g16 = vocab(narrow * mul(std::min(chunk, Tmax), std::max<std::uint64_t>(rows, 1)), sizeof(bf16));
    if (P > 1) {
      const BufferSpec hidden = vocab(mul(Tmax, H), e.act), grad = vocab(mul(Tmax, H), e.acc);
      const BufferSpec targets = vocab(Tmax, kTargetBytes);
      b.fwd_lanes = {hidden, targets, vocab(mul(3, Tmax), kStatBytes)};
      b.bwd_lanes = {hidden, targets, vocab(Tmax, kStatBytes), grad};
      b.bwd_partial = grad;
    }
  }
  b.kept = vocab(0, kStatBytes);
  if (o.keep_logits && P > 1) {
    b.kept = b.mode == RingMode::weights ? vocab(mul(T, U(s.dims.vocab)), kStatBytes)
                                         : vocab(mul(U(s.total_tokens()), rows), kStatBytes);
    b.fwd_block = b.bwd_block = vocab(0, kStatBytes);
  }
  return b;
}

Footprint ring_footprint(const RingDtpBuffers& b) {
  Footprint f("ring_dtp/" + std::string(ring_mode_name(b.mode)));
  f.device("forward", b.lse).device("forward", b.kept).device("forward", b.fwd_block).device("forward", b.fwd_stats);
  for (const BufferSpec& l : b.fwd_lanes) f.device("forward", l, 2);
  f.device("saved", b.lse).device("saved", b.kept);
  f.device("backward", b.lse).device("backward", b.kept).device("backward", b.bwd_block);
  f.device("backward", b.bwd_partial);
  for (const BufferSpec& l : b.bwd_lanes) f.device("backward", l, 2);
  f.device("backward", b.g16).device("backward", b.dx_tile).device("backward", b.d_hidden32);
  return f;
}

Footprint fused_footprint(const RingDtpBuffers& b) {
  Footprint f("ring_dtp/fused");
  f.device("forward_backward", b.fused_block).device("forward_backward", b.fused_g16);
  f.device("forward_backward", b.dx_tile);
  return f;
}

}  // namespace

RingDtpBuffers ring_dtp_buffers(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  return ring_dtp(s, o, estimate(elem_bytes));
}

RingDtpBuffers ring_dtp_buffers(const VocabLossShape& s, const VocabLossOptions& o, Precision p) {
  return ring_dtp(s, o, runtime(p));
}

Footprint ring_dtp_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  return ring_footprint(ring_dtp_buffers(s, o, elem_bytes));
}

Footprint ring_dtp_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p) {
  return ring_footprint(ring_dtp_buffers(s, o, p));
}

bool ring_dtp_fuses(const VocabLossShape& s) { return s.ranks() == 1; }

Footprint ring_dtp_step_footprint(const VocabLossShape& s, const VocabLossOptions& o, std::uint64_t elem_bytes) {
  if (!ring_dtp_fuses(s)) return ring_dtp_footprint(s, o, elem_bytes);
  return fused_footprint(ring_dtp_buffers(s, o, elem_bytes));
}

Footprint ring_dtp_step_footprint(const VocabLossShape& s, const VocabLossOptions& o, Precision p) {
  if (!ring_dtp_fuses(s)) return ring_dtp_footprint(s, o, p);
  return fused_footprint(ring_dtp_buffers(s, o, p));
}

}  // namespace peakbound
