#include "peakbound/layers/attention_layer.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/core/error.h"
#include "peakbound/layers/layer_tensor_checks.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/rope.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
// Activations are f32 or bf16 (config.precision; the elem_bytes footprint forms take the
// size). Statistics (rstd, lse), RoPE tables, the kernel workspace and the bf16 path's
// running states (o32, dq32, dkv32, the linear tile) are f32 always.
const u64 kF32 = dtype_size(DType::f32);
const Component kC = Component::attention;

u64 U(std::int64_t v) { return static_cast<u64>(v); }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "attention layer buffer size"); }

// Per-head widths: queries and keys, values (MLA: nope + rope, v_dim; else head_dim), and
// the rotated part of a query or key head (MLA: its last qk_rope_dim columns).
std::int64_t qk_dim(const AttentionLayerConfig& c) { return c.mla ? c.qk_nope_dim + c.qk_rope_dim : c.head_dim; }
std::int64_t val_dim(const AttentionLayerConfig& c) { return c.mla ? c.v_dim : c.head_dim; }
std::int64_t rope_dim(const AttentionLayerConfig& c) { return c.mla ? c.qk_rope_dim : c.head_dim; }

// Row widths of q, k, v and o.
struct Widths {
  std::int64_t q, k, v, o;
};
Widths widths(const AttentionLayerConfig& c) {
  return {c.q_heads * qk_dim(c), c.kv_heads * qk_dim(c), c.kv_heads * val_dim(c), c.q_heads * val_dim(c)};
}

// MLA's sizes: hidden, query heads, the two ranks, the nope / rope / value head dims, the
// q/k head width and kv_b_proj's output width Hq (nope + v).
struct MlaSizes {
  std::int64_t H, Hq, Rq, Rkv, dn, dr, dv, qk, kvw;
};
MlaSizes mla_sizes(const AttentionLayerConfig& c) {
  return {c.hidden,      c.q_heads,     c.q_lora_rank, c.kv_lora_rank,
          c.qk_nope_dim, c.qk_rope_dim, c.v_dim,       c.qk_nope_dim + c.qk_rope_dim,
          c.q_heads * (c.qk_nope_dim + c.v_dim)};
}

// MLA's latent form: no K/V of a whole sequence (S tokens on this rank) on the layer. The
// ring circulates the latent under cp > 1; at cp 1 a sequence longer than a piece has its
// keys expanded from the latent a piece at a time (ring_attention_latent_* on one rank).
bool latent_ring(const AttentionLayerConfig& c, std::int64_t S) {
  return c.mla && c.mla_latent_ring && (c.cp > 1 || (c.piece_tokens > 0 && S > c.piece_tokens));
}
// The attention of a sequence of S tokens on this rank runs as a ring call (under cp, or
// MLA's latent form at cp 1) rather than the single-rank kernel.
bool ring_call(const AttentionLayerConfig& c, std::int64_t S) { return c.cp > 1 || latent_ring(c, S); }

AttentionDims dims_of(std::int64_t T, const AttentionLayerConfig& c) {
  AttentionDims d;
  d.tokens = T;
  d.q_heads = c.q_heads;
  d.kv_heads = c.kv_heads;
  d.qk_dim = qk_dim(c);
  d.v_dim = val_dim(c);
  d.scale = c.softmax_scale;  // 0: 1 / sqrt(qk), transformers' self.scaling = head_dim ** -0.5
  d.window = c.window;
  d.threads = c.threads;
  return d;
}

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

// The dims of one bf16 query chunk: n rows at q_offset r of a sequence, against its keys 0 .. r + n - 1.
AttentionDims chunk_dims(std::int64_t n, std::int64_t r, const AttentionLayerConfig& c, bool accumulate) {
  AttentionDims d = dims_of(n, c);
  d.q_offset = r;
  d.kv_tokens = r + n;
  d.accumulate = accumulate;
  return d;
}

}  // namespace

void check_attention_layer_config(const AttentionLayerConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument("attention layer: " + what); };
  if (c.hidden <= 0) bad("hidden must be positive (got " + std::to_string(c.hidden) + ")");
  if (c.q_heads <= 0) bad("q_heads must be positive (got " + std::to_string(c.q_heads) + ")");
  if (c.kv_heads <= 0 || c.q_heads % c.kv_heads != 0)
    bad("kv_heads must be positive and divide q_heads (got " + std::to_string(c.kv_heads) + " for " +
        std::to_string(c.q_heads) + " query heads)");
  if (!c.mla && (c.head_dim <= 0 || c.head_dim % 2 != 0))
    bad("head_dim must be positive and even for RoPE (got " + std::to_string(c.head_dim) + ")");
  if (c.mla) {
    if (c.kv_heads != c.q_heads) bad("MLA needs kv_heads == q_heads (K and V are per head after kv_b_proj)");
    if (c.qk_rope_dim <= 0 || c.qk_rope_dim % 2 != 0)
      bad("MLA's qk_rope_dim must be positive and even (got " + std::to_string(c.qk_rope_dim) + ")");
    if (c.qk_nope_dim < 0 || c.v_dim <= 0 || c.kv_lora_rank <= 0 || c.q_lora_rank < 0)
      bad("MLA needs qk_nope_dim >= 0, v_dim > 0, kv_lora_rank > 0 and q_lora_rank >= 0 (got " +
          std::to_string(c.qk_nope_dim) + ", " + std::to_string(c.v_dim) + ", " + std::to_string(c.kv_lora_rank) +
          ", " + std::to_string(c.q_lora_rank) + ")");
    if (c.qk_norm || c.sinks) bad("MLA takes neither qk_norm nor sinks");
  }
  if (!(c.softmax_scale >= 0.0f)) bad("softmax_scale must be >= 0 (0: qk^-0.5)");
  if (!(c.rope_theta > 0.0)) bad("rope_theta must be positive (got " + std::to_string(c.rope_theta) + ")");
  if (!(c.rms_eps >= 0.0f)) bad("rms_eps must be >= 0 (got " + std::to_string(c.rms_eps) + ")");
  if (c.seq_len < 0) bad("seq_len must be >= 0 (got " + std::to_string(c.seq_len) + ")");
  if (c.window < 0) bad("window must be >= 0 (got " + std::to_string(c.window) + ")");
  if (c.output_rows < 0)
    bad("output_rows must be >= 0 (0: all rows at once; got " + std::to_string(c.output_rows) + ")");
  if (c.piece_tokens < 0) bad("piece_tokens must be >= 0 (0: whole; got " + std::to_string(c.piece_tokens) + ")");
  if (c.threads < 1) bad("threads must be >= 1 (got " + std::to_string(c.threads) + ")");
  if (c.cp < 1 || c.cp_rank < 0 || c.cp_rank >= c.cp)
    bad("cp must be >= 1 and cp_rank in [0, cp) (got cp " + std::to_string(c.cp) + ", rank " +
        std::to_string(c.cp_rank) + ")");
  if (c.cp > 1 && c.context_attention == ContextAttention::ulysses) {
    if (const std::string why = ulysses_refusal(c.q_heads, c.kv_heads, c.cp, c.mla); !why.empty()) bad(why);
  }
  if (c.cp > 1 && c.seq_len != 0 && c.seq_len < 2 * static_cast<std::int64_t>(c.cp))
    bad("context parallel over " + std::to_string(c.cp) + " ranks needs sequences of at least " +
        std::to_string(2 * c.cp) + " tokens (2 chunks per rank), got seq_len " + std::to_string(c.seq_len));
}

std::int64_t attention_local_seq_len(const AttentionLayerConfig& c) {
  return c.cp > 1 ? zigzag_shard(c.seq_len, c.cp, c.cp_rank).tokens() : c.seq_len;
}

namespace {

// This rank's tokens per sequence of a T-token call; throws unless T is a whole number of sequences.
std::int64_t sequence_length(std::int64_t T, const AttentionLayerConfig& c) {
  if (c.seq_len == 0 && c.cp > 1)
    throw InvalidArgument("attention layer: context parallel needs the sequence length (seq_len 0)");
  if (c.seq_len == 0) return T;
  const std::int64_t n = attention_local_seq_len(c);
  if (T % n != 0)
    throw InvalidArgument("attention layer: " + std::to_string(T) + " tokens are not a whole number of sequences of " +
                          std::to_string(n) + (c.cp > 1 ? " (this rank's shard of " + std::to_string(c.seq_len) + ")" : ""));
  return n;
}

// The ring's config for sequences of S tokens on this rank (at cp 1: MLA's latent form
// over the one sequence).
RingAttentionConfig ring_config(const AttentionLayerConfig& c, std::int64_t S) {
  RingAttentionConfig r;
  r.dims = dims_of(S, c);
  r.seq_len = c.cp > 1 ? c.seq_len : S;
  r.precision = c.precision;
  r.given_row_dot = true;  // the layer's row_dot: o is freed before the backward's ring
  r.piece_tokens = c.piece_tokens;
  if (latent_ring(c, S)) {
    r.latent = c.kv_lora_rank;
    r.rope = c.qk_rope_dim;
  }
  return r;
}

// Query rows of the bf16 path's fp32 states (o32, dq32) and of one kernel call: a chunk
// at cp = 1, this rank's whole shard under cp > 1 or MLA's latent form (the ring's out / dq).
std::int64_t state_rows(std::int64_t S, const AttentionLayerConfig& c) {
  return ring_call(c, S) ? S : std::min(S, kAttentionChunkRows);
}

// The context-parallel attention call of the K/V form (cp > 1): the ring's, or Ulysses'
// (c.context_attention), the same contract (schedules/ulysses_attention.h).
bool ulysses(const AttentionLayerConfig& c) { return c.cp > 1 && c.context_attention == ContextAttention::ulysses; }
template <class A>
void cp_attention_forward(Device& dev, Communicator& g, const AttentionLayerConfig& c, const RingAttentionConfig& rc,
                          float* out, float* lse, const A* q, const A* k, const A* v) {
  if (ulysses(c))
    ulysses_attention_forward(dev, g, rc, out, lse, q, k, v);
  else
    ring_attention_forward(dev, g, rc, out, lse, q, k, v);
}
template <class A>
void cp_attention_backward(Device& dev, Communicator& g, const AttentionLayerConfig& c, const RingAttentionConfig& rc,
                           float* dq, float* dk, float* dv, const A* dout, const A* q, const A* k, const A* v,
                           const A* out, const float* lse, const float* row_dot) {
  if (ulysses(c))
    ulysses_attention_backward(dev, g, rc, dq, dk, dv, dout, q, k, v, out, lse, row_dot);
  else
    ring_attention_backward(dev, g, rc, dq, dk, dv, dout, q, k, v, out, lse, row_dot);
}
// What such a call holds (for sequences of S tokens on this rank).
// Ulysses gathers the queries of one call (a query piece's over the group, when the layer
// takes them in pieces: attention_query_pieces, the ring's passes), so its buffers follow
// the pieces; the ring's do not.
Footprint cp_attention_footprint(const AttentionLayerConfig& c, std::int64_t S) {
  RingAttentionConfig rc = ring_config(c, S);
  if (!ulysses(c)) return ring_attention_footprint(rc, c.cp);
  rc.query_pieces = ring_attention_pieces(rc, c.cp);
  return ulysses_attention_footprint(rc, c.cp);
}

}  // namespace

AttentionPieceRows attention_piece_rows(std::int64_t S, int m, int i, const AttentionLayerConfig& c) {
  AttentionPieceRows r;
  if (c.cp > 1) {
    const RingQueryRows q = ring_query_rows(c.seq_len, c.cp, c.cp_rank, m, i);
    r.row[0] = q.row0, r.n[0] = q.n0, r.row[1] = q.row1, r.n[1] = q.n1;
  } else {
    r.row[0] = i * c.piece_tokens;
    r.n[0] = std::min(c.piece_tokens, S - r.row[0]);
  }
  return r;
}

namespace {
std::int64_t query_piece_rows(std::int64_t S, int m, const AttentionLayerConfig& c) {
  std::int64_t P = 0;
  for (int i = 0; i < m; ++i) P = std::max(P, attention_piece_rows(S, m, i, c).tokens());
  return P;
}

}  // namespace

int attention_query_pieces(std::int64_t T, const AttentionLayerConfig& c) {
  check_attention_layer_config(c);
  if (c.mla || T <= 0 || c.piece_tokens == 0) return 1;
  if (c.cp > 1) return ring_attention_pieces(ring_config(c, attention_local_seq_len(c)), c.cp);
  const std::int64_t S = sequence_length(T, c);
  return static_cast<int>((S + c.piece_tokens - 1) / c.piece_tokens);
}

AttentionLayerBuffers attention_layer_buffers(std::int64_t T, const AttentionLayerConfig& c, u64 a) {
  check_attention_layer_config(c);
  if (T < 0) throw InvalidArgument("attention layer: tokens must be >= 0 (got " + std::to_string(T) + ")");
  const Widths w = widths(c);
  const u64 t = U(T), q = U(w.q), kv = U(w.k);
  const u64 qk = c.qk_norm ? 1 : 0;
  AttentionLayerBuffers b;
  b.h = buffer_spec(kC, mul(t, U(c.hidden)), a);
  b.rstd = buffer_spec(kC, t, kF32);
  b.q = buffer_spec(kC, mul(t, q), a);
  b.k = buffer_spec(kC, mul(t, kv), a);
  b.v = buffer_spec(kC, mul(t, U(w.v)), a);
  b.q_pre = buffer_spec(kC, mul(qk, mul(t, q)), a);
  b.k_pre = buffer_spec(kC, mul(qk, mul(t, kv)), a);
  b.q_rstd = buffer_spec(kC, mul(qk, mul(t, U(c.q_heads))), kF32);
  b.k_rstd = buffer_spec(kC, mul(qk, mul(t, U(c.kv_heads))), kF32);
  const std::int64_t S = sequence_length(T, c);
  b.rope_cos = b.rope_sin = buffer_spec(kC, U(ops::rope_table_elems(T > 0 ? S : 0, rope_dim(c))), kF32);
  b.o = buffer_spec(kC, mul(t, U(w.o)), a);
  b.lse = buffer_spec(kC, mul(t, U(c.q_heads)), kF32);
  // The kernel checks T >= 1; with no tokens there is no call and no workspace.
  // Under cp > 1 the ring attention call allocates its own (ring_attention_footprint).
  // Under bf16 each kernel call takes a chunk of queries and its tiles need bf16 room.
  const bool bf = c.precision == Precision::bf16;
  const AttentionDims d = dims_of(bf ? state_rows(S, c) : S, c);
  const DType wd = bf ? DType::bf16 : DType::f32;
  const bool kernel = T > 0 && !ring_call(c, S);
  b.workspace_forward = buffer_spec(kC, kernel ? U(attention_forward_workspace_floats(d, wd)) : 0, kF32);
  // The backward's kernel reads D = rowsum(d_o * o) from row_dot (o is freed before it).
  b.workspace_backward = buffer_spec(kC, kernel ? U(attention_backward_workspace_floats(d, true, wd)) : 0, kF32);
  b.d_o = b.o;
  b.dq = b.q;
  b.dk = b.k;
  b.dv = b.v;
  const u64 states = bf && T > 0 ? 1 : 0;
  // MLA's widths: Rq, Rkv + rope and Hq (nope + v) are products too.
  const std::int64_t Rq = c.mla ? c.q_lora_rank : 0, Rkv = c.mla ? c.kv_lora_rank : 0, dr = rope_dim(c);
  const std::int64_t kvw = c.mla ? c.q_heads * (c.qk_nope_dim + c.v_dim) : 0;
  b.tile = linear_tile_spec(T, std::max({c.hidden, w.q, w.k, w.v, w.o, Rq, Rkv + (c.mla ? dr : 0), kvw}), c.precision,
                            kC);
  b.o32 = buffer_spec(kC, mul(states, mul(U(state_rows(S, c)), U(w.o))), kF32);
  b.dq32 = buffer_spec(kC, mul(states, mul(U(state_rows(S, c)), q)), kF32);
  b.dkv32 = buffer_spec(kC, mul(states, mul(U(S), kv + U(w.v))), kF32);
  const bool latent = latent_ring(c, S);
  if (latent) {
    // The ring expands every block itself: no K/V here; under bf16 dkv32 is its fp32 dc.
    b.k = b.v = b.dk = b.dv = buffer_spec(kC, 0, a);
    b.dkv32 = buffer_spec(kC, mul(states, mul(U(S), U(Rkv))), kF32);
  }
  if (c.mla) {
    const u64 lq = Rq > 0 ? 1 : 0;
    b.qa = b.qa_n = b.dqa = buffer_spec(kC, mul(lq, mul(t, U(Rq))), a);
    b.qa_rstd = buffer_spec(kC, mul(lq, t), kF32);
    b.ckv = buffer_spec(kC, mul(t, U(Rkv + dr)), a);
    b.c_pre = b.c = b.dc = buffer_spec(kC, mul(t, U(Rkv)), a);
    b.c_rstd = buffer_spec(kC, t, kF32);
    b.kr = buffer_spec(kC, mul(t, U(dr)), a);
    b.kv = buffer_spec(kC, latent ? 0 : mul(t, U(kvw)), a);
    b.qr = buffer_spec(kC, mul(t, U(c.q_heads * dr)), a);
    b.dkr32 = buffer_spec(kC, mul(t, U(dr)), kF32);
  }
  const u64 sinks = c.sinks && T > 0 ? 1 : 0;
  b.sinks32 = buffer_spec(kC, mul(sinks, U(c.q_heads)), kF32);
  b.row_dot = buffer_spec(kC, mul(t, U(c.q_heads)), kF32);
  b.query_pieces = T > 0 ? attention_query_pieces(T, c) : 1;
  if (b.query_pieces > 1) {
    const std::int64_t P = query_piece_rows(S, b.query_pieces, c);
    const u64 p = U(P), ring = c.cp > 1 ? 1 : 0;
    b.piece_rows = P;
    b.d_o = buffer_spec(kC, mul(p, U(w.o)), a);
    b.dq = buffer_spec(kC, mul(p, q), a);
    if (c.cp > 1) {
      b.dq32 = buffer_spec(kC, mul(states, mul(p, q)), kF32);
      b.o32 = buffer_spec(kC, mul(states, mul(p, U(w.o))), kF32);
    }
    b.q_piece = buffer_spec(kC, mul(p, q), a);
    b.q_pre_piece = buffer_spec(kC, mul(qk, mul(p, q)), a);
    b.q_rstd_piece = buffer_spec(kC, mul(qk, mul(p, U(c.q_heads))), kF32);
    b.o_piece = buffer_spec(kC, mul(ring, mul(p, U(w.o))), a);
    b.lse_piece = b.row_dot_piece = buffer_spec(kC, mul(ring, mul(p, U(c.q_heads))), kF32);
    b.h_piece = buffer_spec(kC, mul(p, U(c.hidden)), a);
    b.rstd_piece = buffer_spec(kC, p, kF32);
    b.output_on_host = c.output_on_host;
    if (b.output_on_host) {
      // A piece's rows on their way to the host (cp = 1 too); o_proj's tile of them back.
      b.o_piece = buffer_spec(kC, mul(p, U(w.o)), a);
      const std::int64_t R = c.output_rows > 0 ? std::min(T, c.output_rows) : T;
      b.o_tile = buffer_spec(kC, mul(U(R), U(w.o)), a);
    }
  }
  return b;
}

bool attention_output_on_host(std::int64_t T, const AttentionLayerConfig& c) {
  return c.output_on_host && T > 0 && attention_query_pieces(T, c) > 1;
}

std::uint64_t attention_output_host_bytes(std::int64_t T, const AttentionLayerConfig& c) {
  if (!attention_output_on_host(T, c)) return 0;
  return mul(mul(U(T), U(widths(c).o)), dtype_size(activation_dtype(c.precision)));
}

std::vector<std::string_view> attention_call_phases(std::int64_t T, const AttentionLayerConfig& c,
                                                    AttentionCall call) {
  const bool pieces = T > 0 && attention_query_pieces(T, c) > 1;
  const std::string_view fp = kAttentionForwardPhases[0], fk = kAttentionForwardPhases[1];
  const std::string_view bo = kAttentionBackwardPhases[0], bk = kAttentionBackwardPhases[1],
                         bp = kAttentionBackwardPhases[2], kp = kAttentionKeptProjectPhase;
  switch (call) {
    case AttentionCall::forward:
    case AttentionCall::forward_for_rows:  // o on the host: its kept o_tile comes beside k, v
      if (attention_output_on_host(T, c)) return {fp, fk, kAttentionForwardOutputPhase};
      return {fp, fk};
    case AttentionCall::forward_reusing_kept:
      return {pieces ? kAttentionRowsPhase : kp};
    case AttentionCall::rows:
      return {kAttentionRowsPhase};
    case AttentionCall::backward:
      if (pieces) return {fp, fk, bo, kp, bk, bp};
      return {fp, fk, bo, bk, bp};
    case AttentionCall::backward_taking_kept:
      if (pieces) return {bo, kp, bk, bp};
      return {kp, bo, bk, bp};
  }
  return {};
}

void AttentionOutputHost::release(Device& dev) {
  if (area_.bytes() == 0) return;
  dev.synchronize();
  area_.reset();
}

void* AttentionOutputHost::reserve(Device& dev, std::uint64_t bytes) {
  if (bytes > area_.bytes()) {
    dev.synchronize();  // nothing may still be copying into the area freed here
    area_.reset();
    area_ = host_.allocate(Component::attention, bytes);
  }
  return area_.data();
}

AttentionLayerBuffers attention_layer_buffers(std::int64_t T, const AttentionLayerConfig& c) {
  return attention_layer_buffers(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint attention_layer_footprint(std::int64_t T, const AttentionLayerConfig& c) {
  return attention_layer_footprint(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint attention_layer_footprint(std::int64_t T, const AttentionLayerConfig& c, u64 elem_bytes) {
  const AttentionLayerBuffers b = attention_layer_buffers(T, c, elem_bytes);
  Footprint f("attention layer");
  // o on the host (query pieces, output_on_host): only lse stays on the device, and
  // o_proj reads o back an o_tile at a time.
  const bool host = b.output_on_host;
  // "kept": forward_for_backward's o and lse (o on the host: lse and o_proj's o_tile),
  // held from its end to the backward.
  for (const BufferSpec& s : {host ? b.o_tile : b.o, b.lse}) f.device("kept", s);
  // "rows": forward_for_rows' kept ones, and a forward_rows call's linear tile (bf16).
  for (const BufferSpec& s : {host ? b.o_tile : b.o, b.lse, b.tile}) f.device(kAttentionRowsPhase, s);
  if (b.query_pieces > 1) {
    // The queries in pieces (GQA): every phase but o_proj's backward holds k, v (and their
    // norm's state), the RoPE tables, the tile and the sinks, and one piece's h and rstd; q
    // is a piece's.
    const auto common = [&](std::string_view phase) {
      for (const BufferSpec& s : {b.k, b.v, b.k_pre, b.k_rstd, b.rope_cos, b.rope_sin, b.tile, b.sinks32, b.h_piece,
                                  b.rstd_piece})
        f.device(phase, s);
    };
    // k and v a row tile at a time: in the forward, and in the backward once o_proj's
    // backward is done (beside lse and D).
    common("forward project");
    common(kAttentionKeptProjectPhase);
    for (const BufferSpec& s : {b.lse, b.row_dot}) f.device(kAttentionKeptProjectPhase, s);
    // The kernel a piece at a time, into the whole o (or a piece's, to the host) and lse.
    common("forward");
    for (const BufferSpec& s : {host ? BufferSpec{kC, 0} : b.o, b.lse, b.q_piece, b.q_pre_piece, b.q_rstd_piece,
                                b.o_piece, b.o32, b.lse_piece, b.workspace_forward})
      f.device("forward", s);
    // o_proj from the host, a tile at a time.
    if (host) {
      common(kAttentionForwardOutputPhase);
      for (const BufferSpec& s : {b.lse, b.o_tile}) f.device(kAttentionForwardOutputPhase, s);
    }
    // o_proj's backward (dWo) and D a piece at a time (o whole, or on the host a piece of
    // it brought back; d_o a piece), without k and v; the kernel's pieces beside the whole
    // dk, dv, lse and D (the piece's projections' backward follows each piece's kernel);
    // then the keys' projections' backward, a row tile at a time.
    for (const BufferSpec& s : {host ? b.o_piece : b.o, b.lse, b.row_dot, b.d_o, b.tile})
      f.device("backward output", s);
    common("backward");
    for (const BufferSpec& s : {b.lse, b.row_dot, b.dk, b.dv, b.dkv32, b.d_o, b.dq, b.dq32, b.q_piece, b.q_pre_piece,
                                b.q_rstd_piece, b.lse_piece, b.row_dot_piece, b.workspace_backward})
      f.device("backward", s);
    common("backward project");
    for (const BufferSpec& s : {b.dk, b.dv}) f.device("backward project", s);
    if (c.cp > 1) f.merge(cp_attention_footprint(c, sequence_length(T, c)));
    return f;
  }
  // What every phase holds: the projections' outputs (and the norms' state), the RoPE
  // tables, the linear tile and the widened sinks; MLA's intermediates (else 0 bytes).
  const auto common = [&](std::string_view phase) {
    for (const BufferSpec& s : {b.q, b.k, b.v, b.q_pre, b.k_pre, b.q_rstd, b.k_rstd, b.rope_cos, b.rope_sin, b.tile,
                                b.sinks32, b.qa, b.qa_n, b.qa_rstd, b.ckv, b.c_pre, b.c, b.c_rstd, b.kr, b.kv, b.qr})
      f.device(phase, s);
  };
  // The projections (forward, and a recomputation that runs the kernel): h and rstd; o and
  // lse come after them, for the kernel.
  common("forward project");
  for (const BufferSpec& s : {b.h, b.rstd}) f.device("forward project", s);
  // The projections of a recomputation that takes forward_for_backward's kept o and lse
  // (the backward after it, or a forward under keep_through): beside them.
  common(kAttentionKeptProjectPhase);
  for (const BufferSpec& s : {b.h, b.rstd, b.o, b.lse}) f.device(kAttentionKeptProjectPhase, s);
  // The kernel (h freed: its backward recomputes it from x).
  common("forward");
  for (const BufferSpec& s : {b.o, b.lse, b.workspace_forward, b.o32}) f.device("forward", s);
  // o_proj's backward: d_o and row_dot = rowsum(d_o * o), after which o is freed.
  common("backward output");
  for (const BufferSpec& s : {b.o, b.lse, b.d_o, b.row_dot}) f.device("backward output", s);
  // The kernel's backward: d_o, row_dot and lse beside the gradients (o not held).
  common("backward");
  for (const BufferSpec& s : {b.lse, b.d_o, b.row_dot, b.dq, b.dk, b.dv, b.dq32, b.dkv32, b.workspace_backward, b.dc,
                              b.dkr32})
    f.device("backward", s);
  // The projections' backward: h and rstd again, beside dq, dk, dv.
  common("backward project");
  for (const BufferSpec& s : {b.h, b.rstd, b.dq, b.dk, b.dv, b.dc, b.dkr32, b.dqa}) f.device("backward project", s);
  // Ring attention's internals, live inside the kernel call of each phase.
  if (T > 0 && ring_call(c, sequence_length(T, c)))
    f.merge(cp_attention_footprint(c, sequence_length(T, c)));
  return f;
}

AttentionLayer::AttentionLayer(Device& dev, const AttentionLayerConfig& config, const AttentionLayerTensors& params,
                               const AttentionLayerTensors& grads)
    : dev_(dev), cfg_(config), p_(params), g_(grads) {
  check_attention_layer_config(cfg_);
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Q = cfg_.q_heads * D, K = cfg_.kv_heads * D;
  const DType pd = param_dtype(cfg_.precision);
  DType want = pd;
  auto expect = [&want](const Tensor& t, const Shape& s, const char* name, const char* which) {
    expect_layer_tensor(t, s, want, "attention layer", which, name);
  };
  for (auto [t, which] : {std::pair{&p_, "parameter"}, std::pair{&g_, "gradient"}}) {
    want = t == &p_ ? pd : DType::f32;
    expect(t->w_in, Shape{H}, "w_in", which);
    if (cfg_.mla) {
      const Widths w = widths(cfg_);
      const std::int64_t Rq = cfg_.q_lora_rank, Rkv = cfg_.kv_lora_rank, dr = cfg_.qk_rope_dim;
      if (Rq > 0) {
        expect(t->wqa, Shape{Rq, H}, "wqa", which);
        expect(t->q_a_norm, Shape{Rq}, "q_a_norm", which);
        expect(t->wqb, Shape{w.q, Rq}, "wqb", which);
        if (cfg_.qkv_bias) expect(t->bqa, Shape{Rq}, "bqa", which);
      } else {
        expect(t->wq, Shape{w.q, H}, "wq", which);
      }
      expect(t->wkva, Shape{Rkv + dr, H}, "wkva", which);
      if (cfg_.qkv_bias) expect(t->bkva, Shape{Rkv + dr}, "bkva", which);
      expect(t->kv_a_norm, Shape{Rkv}, "kv_a_norm", which);
      expect(t->wkvb, Shape{cfg_.q_heads * (cfg_.qk_nope_dim + cfg_.v_dim), Rkv}, "wkvb", which);
      expect(t->wo, Shape{H, w.o}, "wo", which);
      if (cfg_.out_bias) expect(t->bo, Shape{H}, "bo", which);
      continue;
    }
    expect(t->wq, Shape{Q, H}, "wq", which);
    expect(t->wk, Shape{K, H}, "wk", which);
    expect(t->wv, Shape{K, H}, "wv", which);
    expect(t->wo, Shape{H, Q}, "wo", which);
    if (cfg_.qk_norm) {
      expect(t->q_norm, Shape{D}, "q_norm", which);
      expect(t->k_norm, Shape{D}, "k_norm", which);
    }
    if (cfg_.qkv_bias) {
      expect(t->bq, Shape{Q}, "bq", which);
      expect(t->bk, Shape{K}, "bk", which);
      expect(t->bv, Shape{K}, "bv", which);
    }
    if (cfg_.out_bias) expect(t->bo, Shape{H}, "bo", which);
    if (cfg_.sinks) expect(t->sinks, Shape{cfg_.q_heads}, "sinks", which);
  }
}

void AttentionLayer::set_seq_len(std::int64_t s) {
  AttentionLayerConfig c = cfg_;
  c.seq_len = s;
  check_attention_layer_config(c);
  cfg_ = c;
}

void AttentionLayer::set_cp_group(Communicator* group) {
  if (group == nullptr || group->size() != cfg_.cp || group->rank() != cfg_.cp_rank)
    throw InvalidArgument("attention layer: the context-parallel group must have cp " + std::to_string(cfg_.cp) +
                          " ranks with this one at cp_rank " + std::to_string(cfg_.cp_rank));
  cp_group_ = group;
}

Communicator& AttentionLayer::ring_group() const {
  if (cfg_.cp == 1) {
    static SingleRankCommunicator one;  // the calls at cp 1 only ask its size and rank
    return one;
  }
  PB_CHECK_MSG(cp_group_ != nullptr, "attention layer: cp > 1 needs set_cp_group before a call");
  return *cp_group_;
}

// RoPE tables of this rank's positions of one sequence: 0 .. S-1, or under cp the two
// zigzag chunks at their global positions, one after the other.
void AttentionLayer::rope_tables(float* cos, float* sin, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const std::int64_t D = rope_dim(cfg_);
  if (cfg_.cp == 1) {
    ops::rope_tables(dev_, s, cos, sin, S, D, 0, cfg_.rope_theta, cfg_.rope_scaling);
    return;
  }
  const CpShard sh = zigzag_shard(cfg_.seq_len, cfg_.cp, cfg_.cp_rank);
  ops::rope_tables(dev_, s, cos, sin, sh.first.len, D, sh.first.begin, cfg_.rope_theta, cfg_.rope_scaling);
  const std::int64_t at = ops::rope_table_elems(sh.first.len, D);
  ops::rope_tables(dev_, s, cos + at, sin + at, sh.second.len, D, sh.second.begin, cfg_.rope_theta,
                   cfg_.rope_scaling);
}

std::int64_t AttentionLayer::check_shape(const Tensor& t, const char* what) const {
  return layer_activation_rows(t, cfg_.hidden, activation_dtype(cfg_.precision), "attention layer", what);
}

template <class A>
void AttentionLayer::attend_forward(Internals& in, std::int64_t b, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const Widths w = widths(cfg_);
  const std::int64_t Hq = cfg_.q_heads, Q = w.q, O = w.o;
  const A *q = in.q.as<A>() + b * Q, *k = in.k.as<A>() + b * w.k, *v = in.v.as<A>() + b * w.v;
  A* o = in.o.as<A>() + b * O;
  float* lse = in.lse.as<float>() + b * Hq;
  // The sinks join the finished rows' fp32 state (the kernel's or the ring's out and lse).
  const auto sink = [&](float* out, float* l, std::int64_t rows) {
    if (cfg_.sinks) ops::attention_sinks_forward(dev_, s, out, l, in.sinks32.as<float>(), rows, Hq, cfg_.head_dim);
  };
  // The ring's call: K/V travel, or MLA's latent and rope key (this sequence's rows).
  const bool latent = latent_ring(cfg_, S);
  const auto ring = [&](float* out) {
    if (latent)
      ring_attention_latent_forward(dev_, ring_group(), ring_config(cfg_, S), out, lse, q,
                                    in.c.as<A>() + b * cfg_.kv_lora_rank, in.kr.as<A>() + b * cfg_.qk_rope_dim,
                                    p_.wkvb.data<A>());
    else
      cp_attention_forward(dev_, ring_group(), cfg_, ring_config(cfg_, S), out, lse, q, k, v);
  };
  if constexpr (std::is_same_v<A, float>) {
    if (!ring_call(cfg_, S))
      ops::attention_forward(dev_, s, o, lse, q, k, v, dims_of(S, cfg_), in.ws.as<float>());
    else
      ring(o);
    sink(o, lse, S);
  } else {
    // fp32 out of up to R query rows at a time, narrowed once into o.
    float* o32 = in.o32.as<float>();
    if (ring_call(cfg_, S)) {
      ring(o32);
      sink(o32, lse, S);
      ops::convert(dev_, s, o, o32, S * O);
      return;
    }
    const std::int64_t R = state_rows(S, cfg_);
    for (std::int64_t r = 0; r < S; r += R) {
      const std::int64_t n = std::min(R, S - r);
      ops::attention_forward(dev_, s, o32, lse + r * Hq, q + r * Q, k, v, chunk_dims(n, r, cfg_, false),
                             in.ws.as<float>());
      sink(o32, lse + r * Hq, n);
      ops::convert(dev_, s, o + r * O, o32, n * O);
    }
  }
}

template <class A>
void AttentionLayer::attend_backward(Internals& in, std::int64_t b, std::int64_t S, const A* d_o,
                                     const float* row_dot, A* dq, A* dk, A* dv, float* dq32, float* dkv32, A* dc,
                                     float* dkr32) {
  Stream& s = dev_.compute_stream();
  const Widths w = widths(cfg_);
  const std::int64_t Hq = cfg_.q_heads, Q = w.q, K = w.k, V = w.v, O = w.o;
  const A *q = in.q.as<A>() + b * Q, *k = in.k.as<A>() + b * K, *v = in.v.as<A>() + b * V;
  const A* o = nullptr;  // the kernels read D = rowsum(d_o * o) from row_dot instead
  const float* lse = in.lse.as<float>() + b * Hq;
  row_dot += b * Hq;
  d_o += b * O;
  dq += b * Q;
  dk += b * K;
  dv += b * V;
  if (latent_ring(cfg_, S)) {
    // dq, dc and the rope key's dkr32 (fp32, before RoPE's backward) from the ring; its
    // share of dWkvb added into the gradient. bf16: dq and dc through fp32, narrowed once.
    const std::int64_t Rkv = cfg_.kv_lora_rank, dr = cfg_.qk_rope_dim;
    const bool f32 = std::is_same_v<A, float>;
    float* dq_to = f32 ? reinterpret_cast<float*>(dq) : dq32;
    float* dc_to = f32 ? reinterpret_cast<float*>(dc + b * Rkv) : dkv32;
    ring_attention_latent_backward(dev_, ring_group(), ring_config(cfg_, S), dq_to, dc_to, dkr32 + b * dr,
                                   g_.wkvb.data<float>(), d_o, q, in.c.as<A>() + b * Rkv, in.kr.as<A>() + b * dr,
                                   p_.wkvb.data<A>(), o, lse, row_dot);
    if constexpr (!std::is_same_v<A, float>) {
      ops::convert(dev_, s, dq, dq32, S * Q);
      ops::convert(dev_, s, dc + b * Rkv, dkv32, S * Rkv);
    }
    return;
  }
  if constexpr (std::is_same_v<A, float>) {
    if (cfg_.cp == 1)
      ops::attention_backward(dev_, s, dq, dk, dv, d_o, q, k, v, o, lse, dims_of(S, cfg_), in.ws.as<float>(), nullptr,
                              row_dot);
    else
      cp_attention_backward(dev_, ring_group(), cfg_, ring_config(cfg_, S), dq, dk, dv, d_o, q, k, v, o, lse,
                            row_dot);
  } else {
    // dk, dv: fp32 sums over every query chunk (or over the ring), narrowed once.
    float *dk32 = dkv32, *dv32 = dkv32 + S * K;
    if (cfg_.cp > 1) {
      cp_attention_backward(dev_, ring_group(), cfg_, ring_config(cfg_, S), dq32, dk32, dv32, d_o, q, k, v, o, lse,
                            row_dot);
      ops::convert(dev_, s, dq, dq32, S * Q);
    } else {
      ops::fill(dev_, s, dkv32, S * (K + V), 0.0f);
      const std::int64_t R = state_rows(S, cfg_);
      for (std::int64_t r = 0; r < S; r += R) {
        const std::int64_t n = std::min(R, S - r);
        ops::fill(dev_, s, dq32, n * Q, 0.0f);
        ops::attention_backward(dev_, s, dq32, dk32, dv32, d_o + r * O, q + r * Q, k, v, o, lse + r * Hq,
                                chunk_dims(n, r, cfg_, true), in.ws.as<float>(), nullptr, row_dot + r * Hq);
        ops::convert(dev_, s, dq + r * Q, dq32, n * Q);
      }
    }
    ops::convert(dev_, s, dk, dk32, S * K);
    ops::convert(dev_, s, dv, dv32, S * V);
  }
}

// h = rmsnorm(x) * w_in and its rstd, allocated afresh (the projections' input: freed
// before the attention kernel, recomputed for the projections' backward, bit for bit).
template <class A>
void AttentionLayer::norm_input(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b) {
  in.h = allocate(dev_, b.h);
  in.rstd = allocate(dev_, b.rstd);
  ops::rmsnorm_forward(dev_, dev_.compute_stream(), in.h.as<A>(), in.rstd.as<float>(), x, p_.w_in.data<A>(), T,
                       cfg_.hidden, cfg_.rms_eps);
}

// Allocates the forward's internals and computes them through o and lse: the
// projections (footprint phase "forward project"), then, with h and rstd freed, the
// kernel and its workspace ("forward").
template <class A>
void AttentionLayer::recompute(Internals& in, const A* x, std::int64_t T, bool attend) {
  const AttentionLayerBuffers b = attention_layer_buffers(T, cfg_);
  in.q = allocate(dev_, b.q);
  in.k = allocate(dev_, b.k);
  in.v = allocate(dev_, b.v);
  in.q_pre = allocate(dev_, b.q_pre);
  in.k_pre = allocate(dev_, b.k_pre);
  in.q_rstd = allocate(dev_, b.q_rstd);
  in.k_rstd = allocate(dev_, b.k_rstd);
  in.cos = allocate(dev_, b.rope_cos);
  in.sin = allocate(dev_, b.rope_sin);
  in.tile = allocate(dev_, b.tile);  // bf16 only (else null)
  in.sinks32 = allocate(dev_, b.sinks32);  // sinks only (else null)
  for (auto [buf, spec] : {std::pair{&in.qa, &b.qa}, std::pair{&in.qa_n, &b.qa_n}, std::pair{&in.qa_rstd, &b.qa_rstd},
                           std::pair{&in.ckv, &b.ckv}, std::pair{&in.c_pre, &b.c_pre}, std::pair{&in.c, &b.c},
                           std::pair{&in.c_rstd, &b.c_rstd}, std::pair{&in.kr, &b.kr}, std::pair{&in.kv, &b.kv},
                           std::pair{&in.qr, &b.qr}})
    *buf = allocate(dev_, *spec);  // MLA only (else null)

  norm_input<A>(in, x, T, b);
  const std::int64_t S = sequence_length(T, cfg_);
  rope_tables(in.cos.as<float>(), in.sin.as<float>(), S);
  if (cfg_.mla)
    mla_project<A>(in, T, S);
  else
    gqa_project<A>(in, T, S);
  // The kernel needs q, k, v only: h and rstd go (the backward recomputes them), and its
  // o and lse take their place (o is h's size where Hq x Dv = H).
  in.h.reset();
  in.rstd.reset();
  if (!attend) return;
  in.o = allocate(dev_, b.o);
  in.lse = allocate(dev_, b.lse);
  in.ws = allocate(dev_, b.workspace_forward);
  in.o32 = allocate(dev_, b.o32);  // bf16 only (else null)
  for (std::int64_t b0 = 0; b0 < T; b0 += S) attend_forward<A>(in, b0, S);
  in.ws.reset();
  in.o32.reset();
}

// GQA: q, k, v from h (the projections, the q/k norms, RoPE).
template <class A>
void AttentionLayer::gqa_project(Internals& in, std::int64_t T, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = Hq * D, K = Hkv * D;
  const A* h = in.h.as<A>();
  float* tile = in.tile.as<float>();
  // With qk_norm the projections land in q_pre / k_pre (the norm's input, which its
  // backward reads) and the norm writes q / k; without, they land in q / k directly.
  A* qp = cfg_.qk_norm ? in.q_pre.as<A>() : in.q.as<A>();
  A* kp = cfg_.qk_norm ? in.k_pre.as<A>() : in.k.as<A>();
  // out [T, n] = h W^T (+ bias: every row starts as the bias, then the product adds).
  const auto project = [&](const Tensor& w, const Tensor& bias, std::int64_t n, A* out) {
    const bool biased = cfg_.qkv_bias;
    if (biased) ops::broadcast_rows(dev_, s, out, bias.data<A>(), T, n);
    linear(dev_, s, T, n, {{.a = h, .lda = H, .b = w.data<A>(), .ldb = H, .k = H, .trans_b = true}}, out, n,
           biased ? LinearMode::add : LinearMode::write, tile);
  };
  project(p_.wq, p_.bq, Q, qp);
  project(p_.wk, p_.bk, K, kp);
  project(p_.wv, p_.bv, K, in.v.as<A>());
  if (cfg_.qk_norm) {
    // [T, Hq, D] viewed as T*Hq rows of D: RMSNorm over each head's vector.
    ops::rmsnorm_forward(dev_, s, in.q.as<A>(), in.q_rstd.as<float>(), qp, p_.q_norm.data<A>(), T * Hq, D,
                         cfg_.rms_eps);
    ops::rmsnorm_forward(dev_, s, in.k.as<A>(), in.k_rstd.as<float>(), kp, p_.k_norm.data<A>(), T * Hkv, D,
                         cfg_.rms_eps);
  }
  if (cfg_.sinks) {
    if constexpr (std::is_same_v<A, float>)
      dev_.memcpy_async(in.sinks32.data(), p_.sinks.raw(), p_.sinks.nbytes(), CopyKind::device_to_device, s);
    else
      ops::convert(dev_, s, in.sinks32.as<float>(), p_.sinks.data<A>(), Hq);
  }
  for (std::int64_t b = 0; b < T; b += S)
    ops::rope_forward(dev_, s, in.q.as<A>() + b * Q, in.k.as<A>() + b * K, in.cos.as<float>(), in.sin.as<float>(),
                      S, Hq, Hkv, D);
}

template <class A>
void AttentionLayer::mla_project(Internals& in, std::int64_t T, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const Widths w = widths(cfg_);
  const auto [H, Hq, Rq, Rkv, dn, dr, dv, qk, kvw] = mla_sizes(cfg_);
  const ops::ColumnOrder order = cfg_.rope_interleave ? ops::ColumnOrder::deinterleave : ops::ColumnOrder::same;
  float* tile = in.tile.as<float>();
  const A* h = in.h.as<A>();
  A *q = in.q.as<A>(), *k = in.k.as<A>(), *v = in.v.as<A>();
  // out [T, n] = in [T, kdim] W^T (+ bias: every row starts as it).
  const auto project = [&](const A* x, std::int64_t kdim, const Tensor& wt, const Tensor* bias, std::int64_t n,
                           A* out) {
    if (bias != nullptr) ops::broadcast_rows(dev_, s, out, bias->data<A>(), T, n);
    linear(dev_, s, T, n, {{.a = x, .lda = kdim, .b = wt.data<A>(), .ldb = kdim, .k = kdim, .trans_b = true}}, out, n,
           bias != nullptr ? LinearMode::add : LinearMode::write, tile);
  };
  // Queries [T, Hq, nope + rope].
  if (Rq > 0) {
    project(h, H, p_.wqa, cfg_.qkv_bias ? &p_.bqa : nullptr, Rq, in.qa.as<A>());
    ops::rmsnorm_forward(dev_, s, in.qa_n.as<A>(), in.qa_rstd.as<float>(), in.qa.as<A>(), p_.q_a_norm.data<A>(), T,
                         Rq, kMlaNormEps);
    project(in.qa_n.as<A>(), Rq, p_.wqb, nullptr, w.q, q);
  } else {
    project(h, H, p_.wq, nullptr, w.q, q);
  }
  // The latent and the shared rope key: ckv [T, Rkv + rope] -> c = rmsnorm(ckv[:, :Rkv]), kr.
  A* ckv = in.ckv.as<A>();
  project(h, H, p_.wkva, cfg_.qkv_bias ? &p_.bkva : nullptr, Rkv + dr, ckv);
  ops::copy_columns(dev_, s, in.c_pre.as<A>(), Rkv, ckv, Rkv + dr, T, Rkv);
  ops::rmsnorm_forward(dev_, s, in.c.as<A>(), in.c_rstd.as<float>(), in.c_pre.as<A>(), p_.kv_a_norm.data<A>(), T, Rkv,
                       kMlaNormEps);
  ops::copy_columns(dev_, s, in.kr.as<A>(), dr, ckv + Rkv, Rkv + dr, T, dr, order);
  // RoPE on the queries' rope columns (taken out, rotated, put back) and on the one shared key.
  A* qr = in.qr.as<A>();
  ops::copy_columns(dev_, s, qr, dr, q + dn, qk, T * Hq, dr, order);
  for (std::int64_t b = 0; b < T; b += S)
    ops::rope_forward(dev_, s, qr + b * Hq * dr, in.kr.as<A>() + b * dr, in.cos.as<float>(), in.sin.as<float>(), S,
                      Hq, 1, dr);
  ops::copy_columns(dev_, s, q + dn, qk, qr, dr, T * Hq, dr);
  // k [T, Hq, nope + rope] = [(c Wkvb^T)'s nope | the rotated key for every head], v its v
  // part; the latent ring expands each block itself instead.
  if (!latent_ring(cfg_, S))
    mla_expand_kv(dev_, s, T, Hq, Rkv, dn, dr, dv, in.c.as<A>(), in.kr.as<A>(), p_.wkvb.data<A>(), k, v, in.kv.as<A>(),
                  tile);
}

template <class A>
void AttentionLayer::mla_backward(Internals& in, std::int64_t T, std::int64_t S, A* dq, A* dk, A* dv, A* dqa, A* dc,
                                  float* dkr32, float* tile) {
  Stream& s = dev_.compute_stream();
  const Widths w = widths(cfg_);
  const auto [H, Hq, Rq, Rkv, dn, dr, dvd, qk, kvw] = mla_sizes(cfg_);
  const ops::ColumnOrder back = cfg_.rope_interleave ? ops::ColumnOrder::interleave : ops::ColumnOrder::same;
  A* h = in.h.as<A>();
  // The queries' rope columns: RoPE's backward, back to the projection's column order.
  A* qr = in.qr.as<A>();
  ops::copy_columns(dev_, s, qr, dr, dq + dn, qk, T * Hq, dr);
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    ops::rope_backward(dev_, s, qr + b0 * Hq * dr, static_cast<A*>(nullptr), in.cos.as<float>(), in.sin.as<float>(), S,
                       Hq, 0, dr);
  ops::copy_columns(dev_, s, dq + dn, qk, qr, dr, T * Hq, dr, back);
  // The shared rope key's gradient: every head's, summed in fp32 (the latent ring's
  // already is), then RoPE's backward.
  const bool ring = latent_ring(cfg_, S);
  if (!ring) {
    ops::fill(dev_, s, dkr32, T * dr, 0.0f);
    for (std::int64_t hd = 0; hd < Hq; ++hd)
      ops::copy_columns(dev_, s, dkr32, dr, dk + hd * qk + dn, Hq * qk, T, dr, ops::ColumnOrder::same, true);
  }
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    ops::rope_backward(dev_, s, static_cast<float*>(nullptr), dkr32 + b0 * dr, in.cos.as<float>(), in.sin.as<float>(),
                       S, 0, 1, dr);
  // d kv [T, Hq, nope + v] (into kv's buffer): the keys' nope part and the values; then
  // dWkvb and dc (the latent ring has done both).
  if (!ring) {
    A* dkv = in.kv.as<A>();
    ops::copy_columns(dev_, s, dkv, dn + dvd, dk, qk, T * Hq, dn);
    ops::copy_columns(dev_, s, dkv + dn, dn + dvd, dv, dvd, T * Hq, dvd);
    add_weight_grad(dev_, s, kvw, Rkv, T, dkv, in.c.as<A>(), g_.wkvb.data<float>());
    linear(dev_, s, T, Rkv, {{.a = dkv, .lda = kvw, .b = p_.wkvb.data<A>(), .ldb = Rkv, .k = kvw, .trans_b = false}},
           dc, Rkv, LinearMode::write, tile);
  }
  // kv_a_layernorm's backward adds into its dx: c's buffer, zeroed (its last reader was dWkvb).
  A* dc_pre = in.c.as<A>();
  ops::fill(dev_, s, dc_pre, T * Rkv, 0.0f);
  ops::rmsnorm_backward(dev_, s, dc_pre, g_.kv_a_norm.data<float>(), dc, in.c_pre.as<A>(),
                        p_.kv_a_norm.data<A>(), in.c_rstd.as<float>(), T, Rkv);
  // d ckv [T, Rkv + rope] (into ckv's buffer), then kv_a_proj_with_mqa's gradients.
  A* dckv = in.ckv.as<A>();
  ops::copy_columns(dev_, s, dckv, Rkv + dr, dc_pre, Rkv, T, Rkv);
  ops::copy_columns(dev_, s, dckv + Rkv, Rkv + dr, dkr32, dr, T, dr, back);
  if (cfg_.qkv_bias) ops::add_column_sums(dev_, s, g_.bkva.data<float>(), dckv, T, Rkv + dr);
  add_weight_grad(dev_, s, Rkv + dr, H, T, dckv, h, g_.wkva.data<float>());
  // The queries' projections; dh (+)= each path's input gradient, into h's buffer.
  LinearTerm<A> q_term;
  if (Rq > 0) {
    A* qa_n = in.qa_n.as<A>();
    add_weight_grad(dev_, s, w.q, Rq, T, dq, qa_n, g_.wqb.data<float>());
    linear(dev_, s, T, Rq, {{.a = dq, .lda = w.q, .b = p_.wqb.data<A>(), .ldb = Rq, .k = w.q, .trans_b = false}},
           dqa, Rq, LinearMode::write, tile);
    ops::fill(dev_, s, qa_n, T * Rq, 0.0f);  // d qa, added into by the norm's backward
    ops::rmsnorm_backward(dev_, s, qa_n, g_.q_a_norm.data<float>(), dqa, in.qa.as<A>(), p_.q_a_norm.data<A>(),
                          in.qa_rstd.as<float>(), T, Rq);
    if (cfg_.qkv_bias) ops::add_column_sums(dev_, s, g_.bqa.data<float>(), qa_n, T, Rq);
    add_weight_grad(dev_, s, Rq, H, T, qa_n, h, g_.wqa.data<float>());
    q_term = {.a = qa_n, .lda = Rq, .b = p_.wqa.data<A>(), .ldb = H, .k = Rq, .trans_b = false};
  } else {
    add_weight_grad(dev_, s, w.q, H, T, dq, h, g_.wq.data<float>());
    q_term = {.a = dq, .lda = w.q, .b = p_.wq.data<A>(), .ldb = H, .k = w.q, .trans_b = false};
  }
  linear(dev_, s, T, H, {q_term, {.a = dckv, .lda = Rkv + dr, .b = p_.wkva.data<A>(), .ldb = H, .k = Rkv + dr,
                                  .trans_b = false}},
         h, H, LinearMode::write, tile);
}

void AttentionLayer::forward(const Tensor& x, const Tensor& y) {
  const PhaseScope phase(StepPhase::attention);
  if (cfg_.precision == Precision::bf16)
    forward_as<bf16>(x, &y, keep_through_, false);
  else
    forward_as<float>(x, &y, keep_through_, false);
}

void AttentionLayer::forward_for_backward(const Tensor& x, const Tensor& y) {
  const PhaseScope phase(StepPhase::attention);
  if (cfg_.precision == Precision::bf16)
    forward_as<bf16>(x, &y, true, keep_through_);
  else
    forward_as<float>(x, &y, true, keep_through_);
}

void AttentionLayer::forward_for_rows(const Tensor& x) {
  const PhaseScope phase(StepPhase::attention);
  if (cfg_.precision == Precision::bf16)
    forward_as<bf16>(x, nullptr, true, keep_through_);
  else
    forward_as<float>(x, nullptr, true, keep_through_);
}

void AttentionLayer::forward_rows(const Tensor& x, std::int64_t first, std::int64_t rows, void* y) {
  const PhaseScope phase(StepPhase::attention);
  const std::int64_t T = check_shape(x, "x");
  if (first < 0 || rows < 0 || first > T - rows)
    throw InvalidArgument("attention layer: forward_rows' rows [" + std::to_string(first) + ", " +
                          std::to_string(first + rows) + ") are outside the call's " + std::to_string(T) + " tokens");
  if (rows == 0) return;
  if (kept_x_ != x.raw() || kept_tokens_ != T || kept_lse_.bytes() == 0)
    throw InvalidArgument("attention layer: forward_rows needs forward_for_rows on the same x first");
  const std::int64_t tile = cfg_.output_rows;
  if (tile > 0 && (first % tile != 0 || (rows % tile != 0 && first + rows != T)))
    throw InvalidArgument("attention layer: forward_rows' rows [" + std::to_string(first) + ", " +
                          std::to_string(first + rows) + ") are not whole tiles of output_rows " +
                          std::to_string(tile));
  if (cfg_.precision == Precision::bf16)
    forward_rows_as<bf16>(x.data<bf16>(), first, rows, static_cast<bf16*>(y));
  else
    forward_rows_as<float>(x.data<float>(), first, rows, static_cast<float*>(y));
}

// y = x + (bias) + o Wo^T over rows [first, first + rows): the whole forward's steps on
// those rows, the projection over the same output_rows tiles (so the same bits).
template <class A>
void AttentionLayer::forward_rows_as(const A* x, std::int64_t first, std::int64_t rows, A* y) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, Q = widths(cfg_).o;
  const AttentionLayerBuffers b = attention_layer_buffers(kept_tokens_, cfg_);
  const Buffer tile = allocate(dev_, b.tile);  // bf16 only (else null)
  const A* o = kept_on_host_ ? host_output<A>(kept_tokens_) : kept_o_.as<A>();
  dev_.memcpy_async(y, x + first * H, static_cast<std::size_t>(rows * H) * sizeof(A), CopyKind::device_to_device, s);
  if (cfg_.out_bias) ops::add_bias(dev_, s, y, p_.bo.data<A>(), rows, H);
  project_output<A>(o + first * Q, rows, y, tile.as<float>(), kept_on_host_ ? kept_stage_.as<A>() : nullptr);
}

template <class A>
void AttentionLayer::project_output(const A* o, std::int64_t rows, A* y, float* tile, A* stage) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, Q = widths(cfg_).o;
  const std::int64_t step = cfg_.output_rows > 0 ? cfg_.output_rows : rows;
  for (std::int64_t r0 = 0; r0 < rows; r0 += step) {
    const std::int64_t n = std::min(step, rows - r0);
    const A* a = o + r0 * Q;
    if (stage != nullptr) {  // the tile's rows from the host, then the same product on them
      dev_.memcpy_async(stage, a, static_cast<std::size_t>(n * Q) * sizeof(A), CopyKind::host_to_device, s);
      a = stage;
    }
    linear(dev_, s, n, H, {{.a = a, .lda = Q, .b = p_.wo.data<A>(), .ldb = Q, .k = Q, .trans_b = true}}, y + r0 * H,
           H, LinearMode::add, tile);
  }
}

template <class A>
A* AttentionLayer::host_output(std::int64_t T) {
  if (out_host_ == nullptr)
    throw InvalidArgument("attention layer: output_on_host needs set_output_host's area before a call");
  return static_cast<A*>(out_host_->reserve(dev_, attention_output_host_bytes(T, cfg_)));
}

void AttentionLayer::set_keep_through(bool on) {
  if (on && cfg_.output_on_host)
    throw InvalidArgument(
        "attention layer: keep-through holds every layer's o from its forward to its backward; "
        "it does not combine with output_on_host (one host area for the layers)");
  keep_through_ = on;
  if (!on) drop_kept();  // nothing kept outlives the mode
}

bool AttentionLayer::take_kept(Internals& in, std::int64_t T, bool use) {
  const bool taken = use && kept_lse_.bytes() > 0 && kept_tokens_ == T;
  if (taken) {
    in.o = std::move(kept_o_);
    in.lse = std::move(kept_lse_);
  }
  drop_kept();
  return taken;
}

void AttentionLayer::drop_kept() {
  kept_o_.reset();
  kept_lse_.reset();
  kept_stage_.reset();
  kept_on_host_ = false;
  kept_x_ = nullptr;
}

template <class A>
void AttentionLayer::forward_as(const Tensor& x, const Tensor* y, bool keep, bool reuse) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(y == nullptr || check_shape(*y, "y") == T, "attention layer: y must be [T, H] like x");
  // The stack's forward kept o and lse under keep_through: the recomputation before this
  // layer's backward takes them (its input is the same boundary, restored bit for bit)
  // instead of running the attention again. Any other forward starts afresh: what an
  // earlier one kept is stale.
  Internals in;
  const bool reused = take_kept(in, T, reuse);
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  const AttentionLayerBuffers b = attention_layer_buffers(T, cfg_);
  if (b.output_on_host) host_output<A>(T);  // refused before any work without the area
  if (b.query_pieces > 1) {
    // The queries a piece at a time; nothing but o and lse is needed when they were kept.
    if (reused) {
      in.tile = allocate(dev_, b.tile);  // bf16 only (else null)
    } else {
      pieces_common<A>(in, T, b);
      project_kv<A>(in, x.data<A>(), T, b);
      attend_pieces<A>(in, x.data<A>(), T, b);
    }
  } else {
    recompute<A>(in, x.data<A>(), T, /*attend=*/!reused);
  }
  // y = x + o Wo^T: the residual copy, then o_proj added into it (bf16: rounded once).
  // In place (y is x) there is nothing to copy: x was last read by the projections above.
  // Output on the host: o_proj brings its rows back a tile at a time (never under
  // keep-through, so nothing reused is there).
  const std::int64_t H = cfg_.hidden;
  const bool host = b.output_on_host;
  if (y != nullptr) {
    if (y->raw() != x.raw()) dev_.memcpy_async(y->raw(), x.raw(), x.nbytes(), CopyKind::device_to_device, s);
    if (cfg_.out_bias) ops::add_bias(dev_, s, y->data<A>(), p_.bo.data<A>(), T, H);
    Buffer stage = host ? allocate(dev_, b.o_tile) : Buffer{};
    project_output<A>(host ? host_output<A>(T) : in.o.as<A>(), T, y->data<A>(), in.tile.as<float>(), stage.as<A>());
    if (keep) kept_stage_ = std::move(stage);
  }
  if (keep) {
    // With the output on the host the kept state is lse and o_proj's o_tile (forward_rows'
    // rows come through it, held until the backward so that it is there whenever they are).
    if (host && y == nullptr) kept_stage_ = allocate(dev_, b.o_tile);
    kept_o_ = std::move(in.o);  // empty with the output on the host
    kept_lse_ = std::move(in.lse);
    kept_on_host_ = host;
    kept_x_ = x.raw();
    kept_tokens_ = T;
  }
  // The (other) internals are freed on return: whatever reuses their memory next is
  // ordered after this work on the compute stream.
}

void AttentionLayer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const PhaseScope phase(StepPhase::attention);
  if (cfg_.precision == Precision::bf16)
    backward_as<bf16>(x, dy, dx);
  else
    backward_as<float>(x, dy, dx);
}

// The GQA projections' backward from dq, dk (after RoPE's backward) and dv: the q/k
// norms, the biases, the weight gradients, and dh written into h's buffer.
template <class A>
void AttentionLayer::gqa_backward(Internals& in, std::int64_t T, A* dqp, A* dkp, A* dvp, float* tile) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = Hq * D, K = Hkv * D;
  A *h = in.h.as<A>(), *q = in.q.as<A>(), *k = in.k.as<A>();
  if (cfg_.qk_norm) {
    // The norm's backward adds into its dx: zero q and k (their last reader, the
    // attention backward, is done) and take the projections' gradients there.
    ops::fill(dev_, s, q, T * Q, 0.0f);
    ops::fill(dev_, s, k, T * K, 0.0f);
    ops::rmsnorm_backward(dev_, s, q, g_.q_norm.data<float>(), dqp, in.q_pre.as<A>(), p_.q_norm.data<A>(),
                          in.q_rstd.as<float>(), T * Hq, D);
    ops::rmsnorm_backward(dev_, s, k, g_.k_norm.data<float>(), dkp, in.k_pre.as<A>(), p_.k_norm.data<A>(),
                          in.k_rstd.as<float>(), T * Hkv, D);
    dqp = q;
    dkp = k;
  }
  // Projections: dW += d^T h, then dh = dq Wq + dk Wk + dv Wv into h's buffer (h is
  // read for the last time by the weight gradients, on the same stream, before).
  if (cfg_.qkv_bias) {
    ops::add_column_sums(dev_, s, g_.bq.data<float>(), dqp, T, Q);
    ops::add_column_sums(dev_, s, g_.bk.data<float>(), dkp, T, K);
    ops::add_column_sums(dev_, s, g_.bv.data<float>(), dvp, T, K);
  }
  add_weight_grad(dev_, s, Q, H, T, dqp, h, g_.wq.data<float>());
  add_weight_grad(dev_, s, K, H, T, dkp, h, g_.wk.data<float>());
  add_weight_grad(dev_, s, K, H, T, dvp, h, g_.wv.data<float>());
  linear(dev_, s, T, H,
         {{.a = dqp, .lda = Q, .b = p_.wq.data<A>(), .ldb = H, .k = Q, .trans_b = false},
          {.a = dkp, .lda = K, .b = p_.wk.data<A>(), .ldb = H, .k = K, .trans_b = false},
          {.a = dvp, .lda = K, .b = p_.wv.data<A>(), .ldb = H, .k = K, .trans_b = false}},
         h, H, LinearMode::write, tile);
}

template <class A>
void AttentionLayer::backward_as(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(dy, "dy") == T && check_shape(dx, "dx") == T, "attention layer: token counts differ");
  PB_CHECK_MSG(T == 0 || dx.raw() != x.raw(), "attention layer: dx must not alias x");
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  const A* xp = x.data<A>();
  const A* dyp = dy.data<A>();
  // forward_for_backward's o and lse when it ran on this x: the recomputation skips the
  // attention itself. Otherwise the whole forward again.
  Internals in;
  const bool kept_host = kept_on_host_;
  const bool kept = take_kept(in, T, kept_x_ == x.raw());
  const AttentionLayerBuffers b = attention_layer_buffers(T, cfg_);
  if (b.output_on_host) host_output<A>(T);  // refused before any work without the area
  if (b.query_pieces > 1) {
    // o and lse as forward_for_backward kept them, or a piece at a time (k and v then
    // freed); o_proj's backward on them before k and v are projected again.
    if (kept) {
      in.tile = allocate(dev_, b.tile);  // bf16 only (else null)
    } else {
      pieces_common<A>(in, T, b);
      project_kv<A>(in, xp, T, b);
      attend_pieces<A>(in, xp, T, b);
      release_pieces_common(in);
    }
    Buffer row_dot = allocate(dev_, b.row_dot);
    backward_output_pieces<A>(in, dyp, T, b, kept ? kept_host : b.output_on_host, row_dot.as<float>());
    pieces_common<A>(in, T, b);
    project_kv<A>(in, xp, T, b);
    backward_pieces<A>(in, xp, dyp, dx.data<A>(), T, b, row_dot);
    return;
  }
  recompute<A>(in, xp, T, /*attend=*/!kept);
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = widths(cfg_).q, K = widths(cfg_).k, O = widths(cfg_).o;
  float* tile = in.tile.as<float>();

  // o_proj: dWo += dy^T o [H, O] (dbo += colsum dy); d_o = dy Wo [T, O]; then D =
  // rowsum(d_o * o) [T, Hq] for the kernels (and the sinks), after which o is freed
  // (footprint phase "backward output").
  Buffer d_o = allocate(dev_, b.d_o), row_dot = allocate(dev_, b.row_dot);
  add_weight_grad(dev_, s, H, O, T, dyp, in.o.as<A>(), g_.wo.data<float>());
  if (cfg_.out_bias) ops::add_column_sums(dev_, s, g_.bo.data<float>(), dyp, T, H);
  linear(dev_, s, T, O, {{.a = dyp, .lda = H, .b = p_.wo.data<A>(), .ldb = O, .k = H, .trans_b = false}},
         d_o.as<A>(), O, LinearMode::write, tile);
  ops::attention_row_dot(dev_, s, row_dot.as<float>(), d_o.as<A>(), in.o.as<A>(), dims_of(T, cfg_));
  in.o.reset();

  // Attention ("backward"): dq, dk, dv (written), then RoPE's backward rotates dq, dk in
  // place, sequence by sequence (the workspace is one sequence's).
  Buffer dq = allocate(dev_, b.dq), dk = allocate(dev_, b.dk), dv = allocate(dev_, b.dv);
  Buffer dq32 = allocate(dev_, b.dq32), dkv32 = allocate(dev_, b.dkv32);  // bf16 only (else null)
  Buffer dc = allocate(dev_, b.dc), dkr32 = allocate(dev_, b.dkr32);      // MLA only (else null)
  in.ws = allocate(dev_, b.workspace_backward);
  A *dqp = dq.as<A>(), *dkp = dk.as<A>(), *dvp = dv.as<A>();
  const std::int64_t S = sequence_length(T, cfg_);
  for (std::int64_t b0 = 0; b0 < T; b0 += S) {
    if (cfg_.sinks)  // dsinks from the merged lse and this sequence's rows of D
      ops::attention_sinks_backward(dev_, s, g_.sinks.data<float>(), in.lse.as<float>() + b0 * Hq,
                                    row_dot.as<float>() + b0 * Hq, in.sinks32.as<float>(), S, Hq);
    attend_backward<A>(in, b0, S, d_o.as<A>(), row_dot.as<float>(), dqp, dkp, dvp, dq32.as<float>(),
                       dkv32.as<float>(), dc.as<A>(), dkr32.as<float>());
    if (!cfg_.mla)
      ops::rope_backward(dev_, s, dqp + b0 * Q, dkp + b0 * K, in.cos.as<float>(), in.sin.as<float>(), S, Hq, Hkv, D);
  }
  for (Buffer* done : {&d_o, &row_dot, &in.lse, &in.ws, &dq32, &dkv32}) done->reset();

  // The projections' backward ("backward project"): h again (it was freed before the
  // kernel), then dh into h's buffer.
  norm_input<A>(in, xp, T, b);
  if (cfg_.mla) {
    Buffer dqa = allocate(dev_, b.dqa);  // q_lora_rank only (else null)
    mla_backward<A>(in, T, S, dqp, dkp, dvp, dqa.as<A>(), dc.as<A>(), dkr32.as<float>(), tile);
  } else {
    gqa_backward<A>(in, T, dqp, dkp, dvp, tile);
  }
  A* dh = in.h.as<A>();
  // dx = dy (the residual path) + input_layernorm's backward, which adds. In place (dx
  // is dy) the residual is already there: dy's last reader was o_proj's backward above.
  if (dx.raw() != dy.raw()) dev_.memcpy_async(dx.raw(), dy.raw(), dy.nbytes(), CopyKind::device_to_device, s);
  ops::rmsnorm_backward(dev_, s, dx.data<A>(), g_.w_in.data<float>(), dh, xp, p_.w_in.data<A>(),
                        in.rstd.as<float>(), T, H);
}

template <class A>
void AttentionLayer::pieces_common(Internals& in, std::int64_t T, const AttentionLayerBuffers& b) {
  in.k = allocate(dev_, b.k);
  in.v = allocate(dev_, b.v);
  in.k_pre = allocate(dev_, b.k_pre);    // qk_norm only (else null)
  in.k_rstd = allocate(dev_, b.k_rstd);  // qk_norm only (else null)
  in.cos = allocate(dev_, b.rope_cos);
  in.sin = allocate(dev_, b.rope_sin);
  if (in.tile.bytes() == 0) in.tile = allocate(dev_, b.tile);  // bf16 only (else null); kept if there
  in.sinks32 = allocate(dev_, b.sinks32);                      // sinks only (else null)
  in.hp = allocate(dev_, b.h_piece);
  in.rstdp = allocate(dev_, b.rstd_piece);
  rope_tables(in.cos.as<float>(), in.sin.as<float>(), sequence_length(T, cfg_));
  if (cfg_.sinks) {
    Stream& s = dev_.compute_stream();
    if constexpr (std::is_same_v<A, float>)
      dev_.memcpy_async(in.sinks32.data(), p_.sinks.raw(), p_.sinks.nbytes(), CopyKind::device_to_device, s);
    else
      ops::convert(dev_, s, in.sinks32.as<float>(), p_.sinks.data<A>(), cfg_.q_heads);
  }
}

void AttentionLayer::release_pieces_common(Internals& in) {
  for (Buffer* done : {&in.k, &in.v, &in.k_pre, &in.k_rstd, &in.cos, &in.sin, &in.sinks32, &in.hp, &in.rstdp})
    done->reset();
}

template <class A>
void AttentionLayer::piece_d_o(const AttentionPieceRows& r, std::int64_t b0, const A* dy, A* d_o, float* tile) {
  const std::int64_t H = cfg_.hidden, O = widths(cfg_).o;
  r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
    linear(dev_, dev_.compute_stream(), rn, O,
           {{.a = dy + (b0 + row) * H, .lda = H, .b = p_.wo.data<A>(), .ldb = O, .k = H, .trans_b = false}},
           d_o + at * O, O, LinearMode::write, tile);
  });
}

template <class A>
void AttentionLayer::backward_output_pieces(Internals& in, const A* dy, std::int64_t T, const AttentionLayerBuffers& b,
                                            bool o_on_host, float* row_dot) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, Hq = cfg_.q_heads, O = widths(cfg_).o;
  const std::int64_t S = sequence_length(T, cfg_);
  // o a piece at a time: its rows in the whole o, or (on the host) brought into o_piece.
  Buffer d_o = allocate(dev_, b.d_o), staged = o_on_host ? allocate(dev_, b.o_piece) : Buffer{};
  const A* o = o_on_host ? host_output<A>(T) : in.o.as<A>();
  if (cfg_.out_bias) ops::add_column_sums(dev_, s, g_.bo.data<float>(), dy, T, H);
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    for (int i = 0; i < b.query_pieces; ++i) {
      const AttentionPieceRows r = attention_piece_rows(S, b.query_pieces, i, cfg_);
      piece_d_o<A>(r, b0, dy, d_o.as<A>(), in.tile.as<float>());
      r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
        const std::int64_t g = b0 + row;
        const A* orows = o + g * O;
        if (o_on_host) {
          dev_.memcpy_async(staged.as<A>() + at * O, orows, static_cast<std::size_t>(rn * O) * sizeof(A),
                            CopyKind::host_to_device, s);
          orows = staged.as<A>() + at * O;
        }
        // dWo += dy^T o over the run's rows (the sum over the tokens in run order).
        add_weight_grad(dev_, s, H, O, rn, dy + g * H, orows, g_.wo.data<float>());
        ops::attention_row_dot(dev_, s, row_dot + g * Hq, d_o.as<A>() + at * O, orows, dims_of(rn, cfg_));
      });
    }
  in.o.reset();
}

template <class A>
void AttentionLayer::project_kv(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hkv = cfg_.kv_heads, K = Hkv * D;
  const std::int64_t S = sequence_length(T, cfg_);
  A *hp = in.hp.as<A>(), *kp = cfg_.qk_norm ? in.k_pre.as<A>() : in.k.as<A>(), *v = in.v.as<A>();
  float* tile = in.tile.as<float>();
  for (std::int64_t r0 = 0; r0 < T; r0 += b.piece_rows) {
    const std::int64_t n = std::min(b.piece_rows, T - r0);
    ops::rmsnorm_forward(dev_, s, hp, in.rstdp.as<float>(), x + r0 * H, p_.w_in.data<A>(), n, H, cfg_.rms_eps);
    // out [n, K] = h W^T (+ bias: the rows start as it), as gqa_project.
    for (auto [w, bias, out] : {std::tuple{&p_.wk, &p_.bk, kp + r0 * K}, std::tuple{&p_.wv, &p_.bv, v + r0 * K}}) {
      if (cfg_.qkv_bias) ops::broadcast_rows(dev_, s, out, bias->template data<A>(), n, K);
      linear(dev_, s, n, K, {{.a = hp, .lda = H, .b = w->template data<A>(), .ldb = H, .k = H, .trans_b = true}}, out,
             K, cfg_.qkv_bias ? LinearMode::add : LinearMode::write, tile);
    }
  }
  if (cfg_.qk_norm)
    ops::rmsnorm_forward(dev_, s, in.k.as<A>(), in.k_rstd.as<float>(), kp, p_.k_norm.data<A>(), T * Hkv, D,
                         cfg_.rms_eps);
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    ops::rope_forward(dev_, s, static_cast<A*>(nullptr), in.k.as<A>() + b0 * K, in.cos.as<float>(),
                      in.sin.as<float>(), S, 0, Hkv, D);
}

template <class A>
void AttentionLayer::norm_piece(Internals& in, const A* x, std::int64_t b0, const AttentionPieceRows& r) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden;
  r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
    ops::rmsnorm_forward(dev_, s, in.hp.as<A>() + at * H, in.rstdp.as<float>() + at, x + (b0 + row) * H,
                         p_.w_in.data<A>(), rn, H, cfg_.rms_eps);
  });
}

template <class A>
void AttentionLayer::project_q_piece(Internals& in, const A* x, std::int64_t b0, const AttentionPieceRows& r) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Q = Hq * D, n = r.tokens(), half = D / 2;
  A *hp = in.hp.as<A>(), *q = in.qp.as<A>(), *qpre = cfg_.qk_norm ? in.q_prep.as<A>() : q;
  norm_piece<A>(in, x, b0, r);
  if (cfg_.qkv_bias) ops::broadcast_rows(dev_, s, qpre, p_.bq.data<A>(), n, Q);
  linear(dev_, s, n, Q, {{.a = hp, .lda = H, .b = p_.wq.data<A>(), .ldb = H, .k = H, .trans_b = true}}, qpre, Q,
         cfg_.qkv_bias ? LinearMode::add : LinearMode::write, in.tile.as<float>());
  if (cfg_.qk_norm)
    ops::rmsnorm_forward(dev_, s, q, in.q_rstdp.as<float>(), qpre, p_.q_norm.data<A>(), n * Hq, D, cfg_.rms_eps);
  r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
    ops::rope_forward(dev_, s, q + at * Q, static_cast<A*>(nullptr), in.cos.as<float>() + row * half,
                      in.sin.as<float>() + row * half, rn, Hq, 0, D);
  });
}

template <class A>
void AttentionLayer::attend_pieces(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b) {
  Stream& s = dev_.compute_stream();
  const std::int64_t D = cfg_.head_dim, Hq = cfg_.q_heads, Q = Hq * D, K = cfg_.kv_heads * D, O = widths(cfg_).o;
  const std::int64_t S = sequence_length(T, cfg_);
  const int m = b.query_pieces;
  const bool ring = cfg_.cp > 1;
  constexpr bool kF32Act = std::is_same_v<A, float>;
  const bool host = b.output_on_host;
  if (!host) in.o = allocate(dev_, b.o);
  in.lse = allocate(dev_, b.lse);
  in.qp = allocate(dev_, b.q_piece);
  in.q_prep = allocate(dev_, b.q_pre_piece);    // qk_norm only (else null)
  in.q_rstdp = allocate(dev_, b.q_rstd_piece);  // qk_norm only (else null)
  // o_piece: cp > 1 or the output on the host; lse_piece: cp > 1.
  Buffer o_piece = allocate(dev_, b.o_piece), lse_piece = allocate(dev_, b.lse_piece);
  in.o32 = allocate(dev_, b.o32);  // bf16 only (else null)
  in.ws = allocate(dev_, b.workspace_forward);
  A *o = host ? host_output<A>(T) : in.o.as<A>(), *k = in.k.as<A>(), *v = in.v.as<A>(), *qp = in.qp.as<A>();
  // Rows [g, g + rn) of o from the piece's packed rows at `at` (to the host, or into the whole o).
  const auto put = [&](std::int64_t g, std::int64_t rn, std::int64_t at) {
    if (host)
      dev_.memcpy_async(o + g * O, o_piece.as<A>() + at * O, static_cast<std::size_t>(rn * O) * sizeof(A),
                        CopyKind::device_to_host, s);
    else
      ops::copy_columns(dev_, s, o + g * O, O, o_piece.as<A>() + at * O, O, rn, O);
  };
  float* lse = in.lse.as<float>();
  const auto sink = [&](float* out, float* l, std::int64_t rows) {
    if (cfg_.sinks) ops::attention_sinks_forward(dev_, s, out, l, in.sinks32.as<float>(), rows, Hq, cfg_.head_dim);
  };
  RingAttentionConfig rc = ring ? ring_config(cfg_, S) : RingAttentionConfig{};
  rc.query_pieces = m;
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    for (int i = 0; i < m; ++i) {
      const AttentionPieceRows r = attention_piece_rows(S, m, i, cfg_);
      const std::int64_t n = r.tokens();
      project_q_piece<A>(in, x, b0, r);
      if (ring) {
        // The ring's rows packed (fp32 under bf16, narrowed once), then put at the piece's rows.
        rc.query_piece = i;
        A* op = o_piece.as<A>();
        float* out = kF32Act ? reinterpret_cast<float*>(op) : in.o32.as<float>();
        cp_attention_forward(dev_, ring_group(), cfg_, rc, out, lse_piece.as<float>(), qp, k + b0 * K, v + b0 * K);
        sink(out, lse_piece.as<float>(), n);
        if constexpr (!kF32Act) ops::convert(dev_, s, op, out, n * O);
        r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
          const std::int64_t g = b0 + row;
          put(g, rn, at);
          ops::copy_columns(dev_, s, lse + g * Hq, Hq, lse_piece.as<float>() + at * Hq, Hq, rn, Hq);
        });
        continue;
      }
      // Rows [a0, a0 + n) against keys [0, a0 + n): f32 one call, bf16 in kAttentionChunkRows
      // chunks; into o's rows, or the piece's (then to the host) with the output there.
      const std::int64_t a0 = r.row[0], R = kF32Act ? n : state_rows(S, cfg_);
      for (std::int64_t c0 = 0; c0 < n; c0 += R) {
        const std::int64_t nc = std::min(R, n - c0), g = b0 + a0 + c0;
        A* dst = host ? o_piece.as<A>() + c0 * O : o + g * O;
        float* out = kF32Act ? reinterpret_cast<float*>(dst) : in.o32.as<float>();
        ops::attention_forward(dev_, s, out, lse + g * Hq, qp + c0 * Q, k + b0 * K, v + b0 * K,
                               chunk_dims(nc, a0 + c0, cfg_, false), in.ws.as<float>());
        sink(out, lse + g * Hq, nc);
        if constexpr (!kF32Act) ops::convert(dev_, s, dst, out, nc * O);
      }
      if (host) put(b0 + a0, n, 0);
    }
  for (Buffer* done : {&in.qp, &in.q_prep, &in.q_rstdp, &o_piece, &lse_piece, &in.o32, &in.ws}) done->reset();
}

template <class A>
void AttentionLayer::backward_pieces(Internals& in, const A* x, const A* dy, A* dx, std::int64_t T,
                                     const AttentionLayerBuffers& b, Buffer& row_dot) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = Hq * D, K = Hkv * D, O = widths(cfg_).o, half = D / 2;
  const std::int64_t S = sequence_length(T, cfg_);
  const int m = b.query_pieces;
  const bool ring = cfg_.cp > 1;
  constexpr bool kF32Act = std::is_same_v<A, float>;
  float* tile = in.tile.as<float>();
  A *k = in.k.as<A>(), *v = in.v.as<A>();
  // dx = dy + the norm's backward (added into below, a piece at a time); in place the
  // residual is there already. Rows of dy are read again only by their own piece's d_o,
  // before that piece adds into them (o_proj's backward, before this, read dy whole).
  if (dx != dy) dev_.memcpy_async(dx, dy, static_cast<std::size_t>(T * H) * sizeof(A), CopyKind::device_to_device, s);
  Buffer d_o = allocate(dev_, b.d_o);
  if (cfg_.sinks)  // dsinks from the merged lse and D, sequence by sequence
    for (std::int64_t b0 = 0; b0 < T; b0 += S)
      ops::attention_sinks_backward(dev_, s, g_.sinks.data<float>(), in.lse.as<float>() + b0 * Hq,
                                    row_dot.as<float>() + b0 * Hq, in.sinks32.as<float>(), S, Hq);

  // The kernel a piece at a time ("backward"), each piece's queries then through RoPE's,
  // the q norm's and q_proj's backward into dWq and dx.
  Buffer dk = allocate(dev_, b.dk), dv = allocate(dev_, b.dv), dkv32 = allocate(dev_, b.dkv32);
  Buffer dq = allocate(dev_, b.dq), dq32 = allocate(dev_, b.dq32);
  in.qp = allocate(dev_, b.q_piece);
  in.q_prep = allocate(dev_, b.q_pre_piece);    // qk_norm only (else null)
  in.q_rstdp = allocate(dev_, b.q_rstd_piece);  // qk_norm only (else null)
  Buffer lse_piece = allocate(dev_, b.lse_piece), rd_piece = allocate(dev_, b.row_dot_piece);
  in.ws = allocate(dev_, b.workspace_backward);
  const float *cos = in.cos.as<float>(), *sin = in.sin.as<float>();
  A *hp = in.hp.as<A>(), *dqp = dq.as<A>(), *qp = in.qp.as<A>();
  float* rp = in.rstdp.as<float>();
  // dx's rows += input_layernorm's backward of dh (in h_piece's buffer).
  const auto piece_dx = [&](const AttentionPieceRows& r, std::int64_t b0) {
    r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
      ops::rmsnorm_backward(dev_, s, dx + (b0 + row) * H, g_.w_in.data<float>(), hp + at * H,
                            x + (b0 + row) * H, p_.w_in.data<A>(), rp + at, rn, H);
    });
  };
  RingAttentionConfig rc = ring ? ring_config(cfg_, S) : RingAttentionConfig{};
  rc.query_pieces = m;
  for (std::int64_t b0 = 0; b0 < T; b0 += S) {
    // dk, dv: sums over the pieces (fp32 under bf16, narrowed once after the last).
    float* dk32 = kF32Act ? reinterpret_cast<float*>(dk.as<A>() + b0 * K) : dkv32.as<float>();
    float* dv32 = kF32Act ? reinterpret_cast<float*>(dv.as<A>() + b0 * K) : dkv32.as<float>() + S * K;
    ops::fill(dev_, s, dk32, S * K, 0.0f);
    ops::fill(dev_, s, dv32, S * K, 0.0f);
    for (int i = 0; i < m; ++i) {
      const AttentionPieceRows r = attention_piece_rows(S, m, i, cfg_);
      const std::int64_t n = r.tokens(), a0 = r.row[0];
      piece_d_o<A>(r, b0, dy, d_o.as<A>(), tile);
      project_q_piece<A>(in, x, b0, r);  // h, rstd and q of the piece's rows
      float* dq_to = kF32Act ? reinterpret_cast<float*>(dqp) : dq32.as<float>();
      if (ring) {
        // The piece's lse and D rows packed for the ring.
        r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
          const std::int64_t g = b0 + row;
          ops::copy_columns(dev_, s, lse_piece.as<float>() + at * Hq, Hq, in.lse.as<float>() + g * Hq, Hq, rn, Hq);
          ops::copy_columns(dev_, s, rd_piece.as<float>() + at * Hq, Hq, row_dot.as<float>() + g * Hq, Hq, rn, Hq);
        });
        rc.query_piece = i;
        cp_attention_backward(dev_, ring_group(), cfg_, rc, dq_to, dk32, dv32, d_o.as<A>(), qp, k + b0 * K,
                              v + b0 * K, static_cast<const A*>(nullptr), lse_piece.as<float>(), rd_piece.as<float>());
        if constexpr (!kF32Act) ops::convert(dev_, s, dqp, dq32.as<float>(), n * Q);
      } else {
        // Rows [a0, a0 + n) against keys [0, a0 + n): f32 one call, bf16 in chunks of
        // kAttentionChunkRows (those of the whole sequence: the piece starts at a multiple).
        const std::int64_t R = kF32Act ? n : state_rows(S, cfg_);
        for (std::int64_t c0 = 0; c0 < n; c0 += R) {
          const std::int64_t nc = std::min(R, n - c0), g = b0 + a0 + c0;
          float* dq_c = kF32Act ? dq_to + c0 * Q : dq32.as<float>();
          ops::fill(dev_, s, dq_c, nc * Q, 0.0f);
          ops::attention_backward(dev_, s, dq_c, dk32, dv32, d_o.as<A>() + c0 * O, qp + c0 * Q, k + b0 * K,
                                  v + b0 * K, static_cast<const A*>(nullptr), in.lse.as<float>() + g * Hq,
                                  chunk_dims(nc, a0 + c0, cfg_, true), in.ws.as<float>(), nullptr,
                                  row_dot.as<float>() + g * Hq);
          if constexpr (!kF32Act) ops::convert(dev_, s, dqp + c0 * Q, dq32.as<float>(), nc * Q);
        }
      }
      A* q_dead = qp;  // the piece's q, dead once its kernel is done
      // RoPE's backward at the runs' positions, then the q norm's (into the dead q rows).
      r.for_each_run([&](std::int64_t row, std::int64_t rn, std::int64_t at) {
        ops::rope_backward(dev_, s, dqp + at * Q, static_cast<A*>(nullptr), cos + row * half,
                           sin + row * half, rn, Hq, 0, D);
      });
      A* dq_in = dqp;
      if (cfg_.qk_norm) {
        ops::fill(dev_, s, q_dead, n * Q, 0.0f);
        ops::rmsnorm_backward(dev_, s, q_dead, g_.q_norm.data<float>(), dqp, in.q_prep.as<A>(), p_.q_norm.data<A>(),
                              in.q_rstdp.as<float>(), n * Hq, D);
        dq_in = q_dead;
      }
      if (cfg_.qkv_bias) ops::add_column_sums(dev_, s, g_.bq.data<float>(), dq_in, n, Q);
      // dWq += dq^T h, then dh = dq Wq over h (its last reader), then dx += the norm's backward.
      add_weight_grad(dev_, s, Q, H, n, dq_in, hp, g_.wq.data<float>());
      linear(dev_, s, n, H, {{.a = dq_in, .lda = Q, .b = p_.wq.data<A>(), .ldb = H, .k = Q, .trans_b = false}}, hp,
             H, LinearMode::write, tile);
      piece_dx(r, b0);
    }
    if constexpr (!kF32Act) {
      ops::convert(dev_, s, dk.as<A>() + b0 * K, dk32, S * K);
      ops::convert(dev_, s, dv.as<A>() + b0 * K, dv32, S * K);
    }
  }
  for (Buffer* done : {&d_o, &row_dot, &in.lse, &in.ws, &dq, &dq32, &dkv32, &in.qp, &in.q_prep, &in.q_rstdp,
                       &lse_piece, &rd_piece})
    done->reset();

  // The keys' side ("backward project"): RoPE's and the k norm's backward over the whole
  // dk, then k_proj's and v_proj's a row tile at a time.
  A *dkp = dk.as<A>(), *dvp = dv.as<A>();
  for (std::int64_t b0 = 0; b0 < T; b0 += S)
    ops::rope_backward(dev_, s, static_cast<A*>(nullptr), dkp + b0 * K, cos, sin, S, 0, Hkv, D);
  if (cfg_.qk_norm) {
    ops::fill(dev_, s, k, T * K, 0.0f);  // its last reader, the kernel, is done
    ops::rmsnorm_backward(dev_, s, k, g_.k_norm.data<float>(), dkp, in.k_pre.as<A>(), p_.k_norm.data<A>(),
                          in.k_rstd.as<float>(), T * Hkv, D);
    dkp = k;
  }
  if (cfg_.qkv_bias) {
    ops::add_column_sums(dev_, s, g_.bk.data<float>(), dkp, T, K);
    ops::add_column_sums(dev_, s, g_.bv.data<float>(), dvp, T, K);
  }
  for (std::int64_t r0 = 0; r0 < T; r0 += b.piece_rows) {
    AttentionPieceRows r;
    r.n[0] = std::min(b.piece_rows, T - r0);
    norm_piece<A>(in, x, r0, r);  // h and rstd of the row tile, as norm_input computes them
    add_weight_grad(dev_, s, K, H, r.n[0], dkp + r0 * K, hp, g_.wk.data<float>());
    add_weight_grad(dev_, s, K, H, r.n[0], dvp + r0 * K, hp, g_.wv.data<float>());
    linear(dev_, s, r.n[0], H,
           {{.a = dkp + r0 * K, .lda = K, .b = p_.wk.data<A>(), .ldb = H, .k = K, .trans_b = false},
            {.a = dvp + r0 * K, .lda = K, .b = p_.wv.data<A>(), .ldb = H, .k = K, .trans_b = false}},
           hp, H, LinearMode::write, tile);
    piece_dx(r, r0);
  }
}

std::vector<Parameter> AttentionLayer::parameters() const {
  if (cfg_.mla) {
    std::vector<Parameter> out = {{"input_layernorm.weight", p_.w_in, g_.w_in}};
    if (cfg_.q_lora_rank > 0) {
      out.push_back({"q_a_proj.weight", p_.wqa, g_.wqa});
      if (cfg_.qkv_bias) out.push_back({"q_a_proj.bias", p_.bqa, g_.bqa});
      out.push_back({"q_a_layernorm.weight", p_.q_a_norm, g_.q_a_norm});
      out.push_back({"q_b_proj.weight", p_.wqb, g_.wqb});
    } else {
      out.push_back({"q_proj.weight", p_.wq, g_.wq});
    }
    out.push_back({"kv_a_proj_with_mqa.weight", p_.wkva, g_.wkva});
    if (cfg_.qkv_bias) out.push_back({"kv_a_proj_with_mqa.bias", p_.bkva, g_.bkva});
    out.push_back({"kv_a_layernorm.weight", p_.kv_a_norm, g_.kv_a_norm});
    out.push_back({"kv_b_proj.weight", p_.wkvb, g_.wkvb});
    out.push_back({"o_proj.weight", p_.wo, g_.wo});
    if (cfg_.out_bias) out.push_back({"o_proj.bias", p_.bo, g_.bo});
    return out;
  }
  std::vector<Parameter> out = {{"input_layernorm.weight", p_.w_in, g_.w_in},
                                {"q_proj.weight", p_.wq, g_.wq},
                                {"k_proj.weight", p_.wk, g_.wk},
                                {"v_proj.weight", p_.wv, g_.wv},
                                {"o_proj.weight", p_.wo, g_.wo}};
  if (cfg_.qk_norm) {
    out.push_back({"q_norm.weight", p_.q_norm, g_.q_norm});
    out.push_back({"k_norm.weight", p_.k_norm, g_.k_norm});
  }
  if (cfg_.qkv_bias) {
    out.push_back({"q_proj.bias", p_.bq, g_.bq});
    out.push_back({"k_proj.bias", p_.bk, g_.bk});
    out.push_back({"v_proj.bias", p_.bv, g_.bv});
  }
  if (cfg_.out_bias) out.push_back({"o_proj.bias", p_.bo, g_.bo});
  if (cfg_.sinks) out.push_back({"sinks", p_.sinks, g_.sinks});
  return out;
}

void AttentionLayer::zero_grad() {
  Stream& s = dev_.compute_stream();
  for (const Parameter& p : parameters()) ops::fill(dev_, s, p.grad.data<float>(), p.grad.numel(), 0.0f);
}

}  // namespace peakbound
