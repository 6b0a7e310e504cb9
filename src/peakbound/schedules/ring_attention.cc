// Ring attention (schedules/ring_attention.h): the zigzag shards' K/V blocks travel the
// CP ring through RingExchange (two carried lanes, K and V, in one kv_ring buffer); each
// hop folds the block into this rank's queries with the kernel's accumulate mode, one
// call per (query piece, key chunk) pair with at least one visible key, the ring's
// transfers progressed between calls. The backward
// sends the blocks round again with two accumulated lanes (dK, dV, in dkv_ring with one
// block's contribution), and dq is added into across hops from D_i computed once.
#include "peakbound/schedules/ring_attention.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/attention.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_exchange.h"

namespace peakbound {

namespace {

// Tags of the forward and backward rings (one per lane from the base; Ring-DTP uses 11
// and 21 with at most 4 lanes each).
constexpr int kTagForward = 61, kTagBackward = 71;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::uint64_t kF32 = sizeof(float);
constexpr Component kC = Component::attention;

// Every call's sends in this process (ring_attention_bytes_sent).
std::atomic<std::uint64_t> g_bytes_sent{0};

std::uint64_t U(std::int64_t v) { return static_cast<std::uint64_t>(v); }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

// The config's dims for one kernel call: Tq rows at q_offset against Tk keys at k_offset.
AttentionDims call_dims(const RingAttentionConfig& c, std::int64_t tq, std::int64_t q_off, std::int64_t tk,
                             std::int64_t k_off, bool accumulate) {
  AttentionDims d = c.dims;
  d.tokens = tq;
  d.kv_tokens = tk;
  d.q_offset = q_off;
  d.k_offset = k_off;
  d.accumulate = accumulate;
  return d;
}

// The whole sequence on one rank (CP == 1): the plain kernel.
AttentionDims whole_dims(const RingAttentionConfig& c) { return call_dims(c, c.seq_len, 0, 0, 0, false); }

// Piece j of m of a shard (RingAttentionConfig::piece_tokens): the j-th of m near-equal
// parts of each of its two chunks, as a shard of its own (its local rows: the first part,
// then the second), with the rows its parts start at in the whole shard's local order.
// m = 1: the shard itself.
struct Piece {
  CpShard shard;
  std::int64_t row0 = 0, row1 = 0;
};
Piece piece_of(const CpShard& s, int m, int j) {
  const auto part = [&](std::int64_t n, int i) { return n * i / m; };
  const std::int64_t a0 = part(s.first.len, j), a1 = part(s.first.len, j + 1);
  const std::int64_t b0 = part(s.second.len, j), b1 = part(s.second.len, j + 1);
  return {{{s.first.begin + a0, a1 - a0}, {s.second.begin + b0, b1 - b0}}, a0, s.first.len + b0};
}
Piece piece_of(const RingAttentionConfig& c, int cp, int origin, int m, int j) {
  return piece_of(zigzag_shard(c.seq_len, cp, origin), m, j);
}

// The most tokens a piece of an m-pass call holds (what the travelling buffers are sized for).
std::int64_t widest_piece(const RingAttentionConfig& c, int cp, int m) {
  std::int64_t t = 0;
  for (int o = 0; o < cp; ++o)
    for (int j = 0; j < m; ++j) t = std::max(t, piece_of(c, cp, o, m, j).shard.tokens());
  return t;
}

// Elements origin rank o's set of a lane holds in pass j: its piece's tokens x `width`, per rank.
std::vector<std::size_t> lane_counts(const RingAttentionConfig& c, int cp, int m, int j, std::int64_t width) {
  std::vector<std::size_t> n(static_cast<std::size_t>(cp));
  for (int o = 0; o < cp; ++o)
    n[static_cast<std::size_t>(o)] = static_cast<std::size_t>(piece_of(c, cp, o, m, j).shard.tokens() * width);
  return n;
}

// Some key of chunk kc is visible to some query of chunk qc: the first key is not after
// the last query, and (with a window) the last key is within the window of the first query.
bool pair_visible(const CpChunk& qc, const CpChunk& kc, std::int64_t W) {
  const std::int64_t q_last = qc.begin + qc.len - 1, k_last = kc.begin + kc.len - 1;
  return kc.begin <= q_last && (W == 0 || qc.begin - k_last < W);
}

// A chunk of a shard with its first local row.
struct LocalChunk {
  CpChunk c;
  std::int64_t row;
};
std::vector<LocalChunk> chunks_of(const CpShard& s) { return {{s.first, 0}, {s.second, s.first.len}}; }

// The compute stream of the CPU device runs each kernel call on the caller, and MPI
// moves a large message only inside MPI calls (its fragments need both sides), so the
// next hop's transfer advances only between kernel calls: the query chunks are cut
// into pieces of about kProgressRows rows (a multiple of the tile height, so the
// forward's tiles, and bits, are those of one call per chunk) with progress() after each.
constexpr std::int64_t kProgressRows = 256;
std::vector<LocalChunk> query_pieces(const CpShard& s, std::int64_t block_q) {
  const std::int64_t rows = (kProgressRows + block_q - 1) / block_q * block_q;
  std::vector<LocalChunk> out;
  for (const LocalChunk& c : chunks_of(s))
    for (std::int64_t p = 0; p < c.c.len; p += rows)
      out.push_back({{c.c.begin + p, std::min(rows, c.c.len - p)}, c.row + p});
  return out;
}

// The kernel calls of one hop: each (query piece, key chunk) pair of this rank's shard and
// the hop's block with at least one visible key, with its dims (accumulate mode).
template <class F>
void for_each_call(const RingAttentionConfig& c, const CpShard& mine, const CpShard& blk, F&& f) {
  for (const LocalChunk& qc : query_pieces(mine, c.dims.block_q))
    for (const LocalChunk& kch : chunks_of(blk)) {
      if (!pair_visible(qc.c, kch.c, c.dims.window)) continue;
      f(qc, kch, call_dims(c, qc.c.len, qc.c.begin, kch.c.len, kch.c.begin, true));
    }
}

// Stream timestamps around kernel calls, and the ring's blocking waits with the times
// the data they wait for was posted by the previous rank (RingAttentionStats), or nothing.
// Hops are numbered over the call's passes: pass j's hop h is j P + h of `hops` = m P.
class Timer {
 public:
  enum Kind { carried, accumulated, finished };
  Timer(Device& dev, Stream& s, RingAttentionStats* st, int hops)
      : dev_(dev), s_(s), st_(st), t0_(now()), carried_post_(static_cast<std::size_t>(hops), 0.0),
        acc_post_(static_cast<std::size_t>(hops), 0.0) {
    if (st_) st_->compute_seconds = 0.0;
  }
  bool skip() const { return st_ != nullptr && st_->communication_only; }
  void start() {
    if (st_) dev_.host_task(s_, [st = st_] { st->tick = now(); });
  }
  void stop() {
    if (st_) dev_.host_task(s_, [st = st_] { st->compute_seconds += now() - st->tick; });
  }
  // This rank posted the sends of hop `hop` (carried: in begin(hop); accumulated: send_accumulated()).
  void posted(Kind k, int hop) {
    if (st_) (k == carried ? carried_post_ : acc_post_)[static_cast<std::size_t>(hop)] = now();
  }
  // A blocking wait of the ring at hop `hop`, nothing else left to do.
  template <class F>
  void wait(Kind k, int hop, F&& f) {
    const double t = st_ ? now() : 0.0;
    f();
    if (st_) waits_.push_back({k, hop, t, now()});
  }
  // After the stream is synchronized. With P > 1 every rank of the group calls it (the
  // post times go one hop round the ring).
  void finish(Communicator* g) {
    if (!st_) return;
    st_->wall_seconds = now() - t0_;
    st_->exposed_seconds = std::max(0.0, st_->wall_seconds - st_->compute_seconds);
    st_->wait_seconds = st_->imbalance_seconds = st_->exposed_comm_seconds = 0.0;
    if (g == nullptr || g->size() == 1) return;
    const int P = g->size(), r = g->rank();
    const std::size_t N = carried_post_.size();
    std::vector<double> mine(carried_post_), prev(2 * N);
    mine.insert(mine.end(), acc_post_.begin(), acc_post_.end());
    g->sendrecv(mine.data(), mine.size(), (r + 1) % P, prev.data(), prev.size(), (r - 1 + P) % P, DType::f64, kTagStats);
    for (const Wait& w : waits_) {
      // The previous rank's send this wait receives: hop h's carried data (posted in
      // its begin(h)); the running value for hop h (its send_accumulated at h - 1); the
      // own complete value (its send_accumulated at the pass's last hop, w.hop).
      const std::size_t at = w.kind == carried ? static_cast<std::size_t>(w.hop)
                           : w.kind == accumulated ? N + static_cast<std::size_t>(w.hop - 1)
                                                   : N + static_cast<std::size_t>(w.hop);
      const double post = prev[at];
      st_->wait_seconds += w.done - w.ready;
      st_->imbalance_seconds += std::max(0.0, std::min(w.done, post) - w.ready);
      st_->exposed_comm_seconds += std::max(0.0, w.done - std::max(w.ready, post));
    }
  }

 private:
  static constexpr int kTagStats = 81;
  struct Wait {
    Kind kind;
    int hop;
    double ready, done;
  };
  Device& dev_;
  Stream& s_;
  RingAttentionStats* st_;
  double t0_;
  std::vector<double> carried_post_, acc_post_;
  std::vector<Wait> waits_;
};

// Until the compute stream has run what this hop submitted, keep the ring's transfers
// moving (MPI progresses only inside its calls) without spinning a core the kernels
// need: test, then sleep briefly. What is still in flight afterwards is exposed. The
// CPU device's compute stream runs each call on the caller, so there this returns at
// once (the pieces' progress() calls did the work); a stream that runs behind the host
// gets its transfers moved here.
void progress_while_computing(Device& dev, Stream& s, RingExchange& ring) {
  const Event done = dev.record(s);
  while (!done.query()) {
    ring.progress();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

void check_ring_attention(const RingAttentionConfig& c, int cp) {
  if (cp < 1) throw InvalidArgument("ring attention: cp must be >= 1, got " + std::to_string(cp));
  if (c.seq_len < 2 * static_cast<std::int64_t>(cp))
    throw InvalidArgument("ring attention: seq_len " + std::to_string(c.seq_len) + " must be >= 2 x CP = " +
                          std::to_string(2 * cp) + " (every zigzag chunk non-empty)");
  check_attention_dims(whole_dims(c));
  if (c.latent < 0) throw InvalidArgument("ring attention: latent must be >= 0, got " + std::to_string(c.latent));
  if (c.piece_tokens < 0)
    throw InvalidArgument("ring attention: piece_tokens must be >= 0 (0: whole shards), got " +
                          std::to_string(c.piece_tokens));
  if (c.query_pieces < 1 || c.query_piece < 0 || c.query_piece >= c.query_pieces)
    throw InvalidArgument("ring attention: query_piece must be in [0, query_pieces), query_pieces >= 1 (got " +
                          std::to_string(c.query_piece) + " of " + std::to_string(c.query_pieces) + ")");
  if (c.query_pieces > 1) {
    if (cp == 1 || c.latent > 0)
      throw InvalidArgument("ring attention: query pieces need cp > 1 and the K/V form");
    const std::int64_t shortest = zigzag_shortest_chunk(c.seq_len, cp);
    if (c.query_pieces > shortest)
      throw InvalidArgument("ring attention: " + std::to_string(c.query_pieces) + " query pieces leave a zigzag chunk of " +
                            std::to_string(shortest) + " tokens empty");
  }
  if (c.latent > 0) {
    if (c.dims.kv_heads != c.dims.q_heads)
      throw InvalidArgument("ring attention: the compressed (latent) form needs kv_heads == q_heads");
    if (c.rope <= 0 || c.rope > c.dims.qk_dim)
      throw InvalidArgument("ring attention: rope must be in [1, qk_dim = " + std::to_string(c.dims.qk_dim) +
                            "], got " + std::to_string(c.rope));
  }
}

RingQueryRows ring_query_rows(std::int64_t seq_len, int cp, int rank, int m, int j) {
  const Piece p = piece_of(zigzag_shard(seq_len, cp, rank), m, j);
  return {p.row0, p.shard.first.len, p.row1, p.shard.second.len};
}

int ring_attention_pieces(const RingAttentionConfig& c, int cp) {
  check_ring_attention(c, cp);
  if (c.piece_tokens == 0 || (cp == 1 && c.latent == 0)) return 1;
  const std::int64_t widest = zigzag_widest_tokens(c.seq_len, cp);
  return static_cast<int>(std::clamp<std::int64_t>((widest + c.piece_tokens - 1) / c.piece_tokens, 1,
                                                   zigzag_shortest_chunk(c.seq_len, cp)));
}

namespace {

// Per-token widths of the two carried lanes and of the two accumulated ones: K and V of
// the KV heads, or the latent and the rope key.
std::pair<std::int64_t, std::int64_t> lane_widths(const RingAttentionConfig& c) {
  if (c.latent > 0) return {c.latent, c.rope};
  return {c.dims.kv_heads * c.dims.qk_dim, c.dims.kv_heads * c.dims.v_dim};
}

// The compressed form's expanded block: K [Tmax, H qk], V [Tmax, H v], kv [Tmax, H (nope + v)].
std::int64_t expanded_block(const RingAttentionConfig& c, std::int64_t tokens) {
  return tokens * c.dims.q_heads * (c.dims.qk_dim + c.dims.v_dim);
}
std::int64_t kv_width(const RingAttentionConfig& c) { return c.dims.q_heads * (c.dims.qk_dim - c.rope + c.dims.v_dim); }

}  // namespace

RingAttentionBuffers ring_attention_buffers(const RingAttentionConfig& c, int cp) {
  check_ring_attention(c, cp);
  const AttentionDims& d = c.dims;
  // Under bf16 the carried lanes are bf16 and the kernel's tiles need bf16 room; the
  // accumulators and row_dot stay fp32.
  const DType a = activation_dtype(c.precision);
  RingAttentionBuffers b;
  b.kv_ring = b.dkv_ring = b.row_dot = b.expand = b.tile = buffer_spec(kC, 0, kF32);
  if (cp == 1 && c.latent == 0) {
    // Nothing moves: the single-rank kernel, D_i in its own workspace.
    const AttentionDims w = whole_dims(c);
    b.workspace_forward = buffer_spec(kC, U(attention_forward_workspace_floats(w, a)), kF32);
    b.workspace_backward = buffer_spec(kC, U(attention_backward_workspace_floats(w, c.given_row_dot, a)), kF32);
    return b;
  }
  const auto mul = [](std::uint64_t x, std::uint64_t y) { return checked_mul(x, y, "ring attention"); };
  // The travelling buffers hold the widest piece, row_dot this rank's whole shard.
  const std::int64_t T = widest_piece(c, cp, ring_attention_pieces(c, cp));
  const std::int64_t shard = zigzag_widest_tokens(c.seq_len, cp);
  const auto [w0, w1] = lane_widths(c);
  const std::uint64_t lanes = mul(U(T), U(w0) + U(w1));
  std::uint64_t contribution = 0;  // the compressed form's fp32 dK/dV of one block
  if (c.latent > 0) {
    contribution = U(expanded_block(c, T));
    b.expand = buffer_spec(kC, checked_add(contribution, mul(U(T), U(kv_width(c))), "ring attention"), dtype_size(a));
    b.tile = linear_tile_spec(T, kv_width(c), c.precision, kC);
  }
  // At cp 1 (the compressed form) nothing travels: one packed piece of the latent and
  // rope key (with several pieces; one piece is the caller's tensors) and, in backward,
  // its d c | d kr beside the block's contribution.
  const std::uint64_t carried = cp > 1 ? mul(2, lanes) : ring_attention_pieces(c, cp) > 1 ? lanes : 0;
  const std::uint64_t accumulated = cp > 1 ? mul(3, lanes) : carried;
  b.kv_ring = buffer_spec(kC, carried, dtype_size(a));
  b.dkv_ring = buffer_spec(kC, checked_add(accumulated, contribution, "ring attention"), kF32);
  b.row_dot = buffer_spec(kC, c.given_row_dot ? 0 : mul(U(shard), U(d.q_heads)), kF32);
  b.workspace_forward = buffer_spec(kC, U(attention_forward_workspace_floats(d, a)), kF32);
  b.workspace_backward = buffer_spec(kC, U(attention_backward_workspace_floats(d, true, a)), kF32);
  return b;
}

Footprint ring_attention_footprint(const RingAttentionConfig& c, int cp) {
  const RingAttentionBuffers b = ring_attention_buffers(c, cp);
  Footprint f("ring_attention");
  f.device("forward", b.kv_ring).device("forward", b.expand).device("forward", b.tile);
  f.device("forward", b.workspace_forward);
  f.device("backward", b.kv_ring).device("backward", b.expand).device("backward", b.tile);
  f.device("backward", b.dkv_ring).device("backward", b.row_dot).device("backward", b.workspace_backward);
  return f;
}

std::uint64_t ring_attention_bytes_sent() { return g_bytes_sent.load(); }

namespace {
// check_ring_attention, and rank in [0, cp) (the per-rank counts below).
void check_ring_rank(const RingAttentionConfig& c, int cp, int rank) {
  check_ring_attention(c, cp);
  if (rank < 0 || rank >= cp)
    throw InvalidArgument("ring attention: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(cp) + ")");
}
}  // namespace

AttentionTiles ring_attention_tiles(const RingAttentionConfig& c, int cp, int rank) {
  check_ring_rank(c, cp, rank);
  if (cp == 1 && c.latent == 0) return attention_tiles(whole_dims(c));
  AttentionTiles t;
  const CpShard mine = zigzag_shard(c.seq_len, cp, rank);
  const int m = ring_attention_pieces(c, cp);
  for (int j = 0; j < m; ++j)
    for (int o = 0; o < cp; ++o)
      for_each_call(c, mine, piece_of(c, cp, o, m, j).shard, [&](const LocalChunk&, const LocalChunk&, const AttentionDims& d) {
        const AttentionTiles k = attention_tiles(d);
        t.forward += k.forward;
        t.backward += k.backward;
      });
  return t;
}

RingAttentionTraffic ring_attention_traffic(const RingAttentionConfig& c, int cp, int rank) {
  check_ring_rank(c, cp, rank);
  RingAttentionTraffic t;
  const auto [w0, w1] = lane_widths(c);
  const std::uint64_t a = dtype_size(activation_dtype(c.precision)), w = U(w0) + U(w1);
  // Hop h sends origin (rank - h)'s set: carried at every hop but the last, accumulated at every hop.
  for (int h = 0; h < cp && cp > 1; ++h) {
    const std::uint64_t n = U(zigzag_shard(c.seq_len, cp, ((rank - h) % cp + cp) % cp).tokens()) * w;
    if (h < cp - 1) {
      t.forward += n * a;
      t.backward += n * a;
    }
    t.backward += n * kF32;
  }
  return t;
}

template <class A>
void mla_expand_kv(Device& dev, Stream& s, std::int64_t T, std::int64_t H, std::int64_t latent, std::int64_t nope,
                   std::int64_t rope, std::int64_t v_dim, const A* c_lat, const A* kr, const A* wkvb, A* k, A* v, A* kv,
                   float* tile) {
  const std::int64_t qk = nope + rope, kvw = H * (nope + v_dim);
  linear(dev, s, T, kvw, {{.a = c_lat, .lda = latent, .b = wkvb, .ldb = latent, .k = latent, .trans_b = true}}, kv, kvw,
         LinearMode::write, tile);
  ops::copy_columns(dev, s, v, v_dim, kv + nope, nope + v_dim, T * H, v_dim);
  ops::copy_columns(dev, s, k, qk, kv, nope + v_dim, T * H, nope);
  for (std::int64_t hd = 0; hd < H; ++hd) ops::copy_columns(dev, s, k + hd * qk + nope, H * qk, kr, rope, T, rope);
}
template void mla_expand_kv<float>(Device&, Stream&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, std::int64_t, const float*, const float*, const float*, float*,
                                   float*, float*, float*);
template void mla_expand_kv<bf16>(Device&, Stream&, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                  std::int64_t, std::int64_t, const bf16*, const bf16*, const bf16*, bf16*, bf16*,
                                  bf16*, float*);

namespace {

// What this rank puts on the ring: K and V, or (compressed form) the latent, the rope key
// and kv_b_proj's weight; the backward's outputs: dK and dV, or dc, dkr and dWkvb.
template <class A>
struct KvSource {
  const A *first = nullptr, *second = nullptr;  // k, v | c, kr
  const A* wkvb = nullptr;
};
struct KvGrads {
  float *first = nullptr, *second = nullptr;  // dk, dv | dc, dkr
  float* dwkvb = nullptr;
};

// One pass of a call: pass j of m, its buffers sized for Tmax tokens (widest_piece).
struct Pass {
  int m = 1, j = 0;
  std::int64_t Tmax = 0;
};

// Rows [row, row + n) of a [*, w] tensor to or from a packed [n, w] one (copy_columns
// with every column).
template <class T>
void copy_rows(Device& dev, Stream& s, T* dst, const T* src, std::int64_t n, std::int64_t w, bool add = false) {
  ops::copy_columns(dev, s, dst, w, src, w, n, w, ops::ColumnOrder::same, add);
}
// A piece's two parts of a whole shard's tensor, packed in the piece's local order.
template <class T>
void pack_piece(Device& dev, Stream& s, T* dst, const T* src, const Piece& p, std::int64_t w) {
  copy_rows(dev, s, dst, src + p.row0 * w, p.shard.first.len, w);
  copy_rows(dev, s, dst + p.shard.first.len * w, src + p.row1 * w, p.shard.second.len, w);
}
// add: added into dst's rows instead of written.
template <class T>
void unpack_piece(Device& dev, Stream& s, T* dst, const T* src, const Piece& p, std::int64_t w, bool add = false) {
  copy_rows(dev, s, dst + p.row0 * w, src, p.shard.first.len, w, add);
  copy_rows(dev, s, dst + p.row1 * w, src + p.shard.first.len * w, p.shard.second.len, w, add);
}

// The two carried lanes in kv_ring's two slots. With pieces (m > 1) this rank's piece of
// the pass is not contiguous in its tensors: it is packed into the slot hop 0 does not
// receive into (RingExchange's hop 0 receives into slot 0; slot 1 first receives at hop
// 1, after hop 0's send has left).
template <class A>
std::pair<int, int> add_carried_lanes(Device& dev, Stream& s, RingExchange& ring, const RingAttentionConfig& c, int P,
                                      const Pass& pass, A* base, const KvSource<A>& src) {
  const auto [w0, w1] = lane_widths(c);
  const std::int64_t slot = pass.Tmax * (w0 + w1), off = pass.Tmax * w0;
  const A *own0 = src.first, *own1 = src.second;
  if (pass.m > 1) {
    const Piece mine = piece_of(c, P, ring.origin(0), pass.m, pass.j);
    pack_piece(dev, s, base + slot, src.first, mine, w0);
    pack_piece(dev, s, base + slot + off, src.second, mine, w1);
    own0 = base + slot;
    own1 = base + slot + off;
  }
  constexpr DType kA = dtype_of<A>();
  return {ring.add_carried(own0, RingLane{{base, base + slot}, kA, lane_counts(c, P, pass.m, pass.j, w0)}),
          ring.add_carried(own1, RingLane{{base + off, base + slot + off}, kA, lane_counts(c, P, pass.m, pass.j, w1)})};
}

// The compressed form's block of tb tokens expanded from its latent l0 and rope key l1 into
// `ex` (K, V, then kv_b_proj's output, each sized for Tmax tokens): its K and V.
template <class A>
std::pair<const A*, const A*> expand_block(Device& dev, Stream& s, const RingAttentionConfig& c, std::int64_t tb,
                                           std::int64_t Tmax, const A* l0, const A* l1, const A* wkvb, A* ex,
                                           float* tile, Timer& timer) {
  const std::int64_t H = c.dims.q_heads;
  A* kx = ex;
  A* vx = ex + Tmax * H * c.dims.qk_dim;
  timer.start();
  if (!timer.skip())
    mla_expand_kv(dev, s, tb, H, c.latent, c.dims.qk_dim - c.rope, c.rope, c.dims.v_dim, l0, l1, wkvb, kx, vx,
                  vx + Tmax * H * c.dims.v_dim, tile);
  timer.stop();
  return {kx, vx};
}

// This hop's K and V of tb tokens: the carried lanes, or (compressed form) the block
// expanded from them into `ex` (K, V, then kv_b_proj's output).
template <class A>
std::pair<const A*, const A*> hop_kv(Device& dev, Stream& s, const RingAttentionConfig& c, RingExchange& ring,
                                     std::pair<int, int> lanes, std::int64_t tb, std::int64_t Tmax, A* ex,
                                     float* tile, const A* wkvb, Timer& timer) {
  const A* l0 = static_cast<const A*>(ring.carried(lanes.first));
  const A* l1 = static_cast<const A*>(ring.carried(lanes.second));
  if (c.latent == 0) return {l0, l1};
  return expand_block(dev, s, c, tb, Tmax, l0, l1, wkvb, ex, tile, timer);
}

// The compressed form at cp 1, where nothing travels: the keys go in the call's m pieces
// (piece_of the one shard, as a ring's pass would carry them), piece j's latent and rope
// key packed into `packed` (m > 1; one piece is the caller's tensors) and expanded into
// ex, so K and V are never whole. Returns K, V and the latent the block was expanded from.
template <class A>
struct LocalBlock {
  const A *k = nullptr, *v = nullptr, *latent = nullptr;
};
template <class A>
LocalBlock<A> local_block(Device& dev, Stream& s, const RingAttentionConfig& c, const KvSource<A>& src, const Piece& p,
                          int m, std::int64_t Tmax, A* packed, A* ex, float* tile, Timer& timer) {
  const A *l0 = src.first, *l1 = src.second;
  if (m > 1) {
    pack_piece(dev, s, packed, src.first, p, c.latent);
    pack_piece(dev, s, packed + Tmax * c.latent, src.second, p, c.rope);
    l0 = packed;
    l1 = packed + Tmax * c.latent;
  }
  const auto [kx, vx] = expand_block(dev, s, c, p.shard.tokens(), Tmax, l0, l1, src.wkvb, ex, tile, timer);
  return {kx, vx, l0};
}

// Written once for A = float | bf16 (q, k, v, dout, out and the carried lanes); A = float
// is the f32-only code's calls in its order.
template <class A>
void forward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse, const A* q,
                const KvSource<A>& src, ThreadPool* pool, RingAttentionStats* stats) {
  check_precision(c.precision, precision_of<A>(), "ring attention", "q, k, v");
  const int P = g.size(), m = ring_attention_pieces(c, P);
  const RingAttentionBuffers b = ring_attention_buffers(c, P);
  Stream& s = dev.compute_stream();
  Timer timer(dev, s, stats, m * P);
  const std::int64_t Hq = c.dims.q_heads, Hkv = c.dims.kv_heads, D = c.dims.qk_dim, Dv = c.dims.v_dim;
  Buffer ws = allocate(dev, b.workspace_forward);
  if (P == 1 && c.latent == 0) {
    timer.start();
    if (!timer.skip())
      ops::attention_forward(dev, s, out, lse, q, src.first, src.second, whole_dims(c), ws.as<float>(), pool);
    timer.stop();
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  // The queries: this rank's shard, or its query piece (packed rows).
  const CpShard mine = piece_of(zigzag_shard(c.seq_len, P, g.rank()), c.query_pieces, c.query_piece).shard;
  const std::int64_t T = mine.tokens(), Tmax = widest_piece(c, P, m);
  Buffer kv = allocate(dev, b.kv_ring), ex = allocate(dev, b.expand), tile = allocate(dev, b.tile);
  // Every row starts empty (lse -inf: out is not read).
  ops::fill(dev, s, lse, T * Hq, kNegInf);
  // One query piece and key chunk pair of the kernel (accumulate mode).
  const auto attend = [&](const A* kc, const A* vc, const LocalChunk& qc, const LocalChunk& kch,
                          const AttentionDims& d) {
    timer.start();
    if (!timer.skip())
      ops::attention_forward(dev, s, out + qc.row * Hq * Dv, lse + qc.row * Hq, q + qc.row * Hq * D,
                             kc + kch.row * Hkv * D, vc + kch.row * Hkv * Dv, d, ws.as<float>(), pool);
    timer.stop();
  };
  if (P == 1) {  // the compressed form: the keys a piece at a time, nothing travels
    for (int j = 0; j < m; ++j) {
      const Piece p = piece_of(mine, m, j);
      const LocalBlock<A> blk = local_block(dev, s, c, src, p, m, Tmax, kv.as<A>(), ex.as<A>(), tile.as<float>(), timer);
      for_each_call(c, mine, p.shard, [&](const LocalChunk& qc, const LocalChunk& kch, const AttentionDims& d) {
        attend(blk.k, blk.v, qc, kch, d);
      });
    }
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  std::uint64_t sent = 0;
  for (int j = 0; j < m; ++j) {
    RingExchange ring(dev, g, kTagForward);
    const std::pair<int, int> lanes = add_carried_lanes(dev, s, ring, c, P, Pass{m, j, Tmax}, kv.as<A>(), src);
    for (int hop = 0; hop < P; ++hop) {
      const int at = j * P + hop;
      ring.begin(hop);
      timer.posted(Timer::carried, at);
      const CpShard blk = piece_of(c, P, ring.origin(hop), m, j).shard;
      const auto [kc, vc] = hop_kv(dev, s, c, ring, lanes, blk.tokens(), Tmax, ex.as<A>(), tile.as<float>(),
                                   src.wkvb, timer);
      for_each_call(c, mine, blk, [&](const LocalChunk& qc, const LocalChunk& kch, const AttentionDims& d) {
        attend(kc, vc, qc, kch, d);
        ring.progress();
      });
      progress_while_computing(dev, s, ring);
      timer.wait(Timer::carried, at, [&] { ring.end(hop); });
    }
    sent += ring.bytes_sent();
  }
  dev.synchronize(s);
  timer.finish(&g);
  if (stats) stats->bytes_sent = sent;
  g_bytes_sent += sent;
}

// The compressed form's backward of one block (tb tokens, its latent cc): dKx, dVx (this
// rank's queries' fp32 contribution) into d kv (kv_b_proj's output's gradient, the
// activation dtype, in dkv), dWkvb += d kv^T cc, dc = d kv Wkvb and dkr = the heads' dK
// rope columns summed (both fp32, WRITTEN).
template <class A>
void contract_block(Device& dev, Stream& s, const RingAttentionConfig& c, std::int64_t tb, const float* dkx,
                    const float* dvx, const A* cc, const A* wkvb, A* dkv, float* dwkvb, float* dc, float* dkr) {
  const std::int64_t H = c.dims.q_heads, qk = c.dims.qk_dim, dv = c.dims.v_dim, dr = c.rope, dn = qk - dr;
  const std::int64_t kvw = kv_width(c), L = c.latent;
  ops::copy_columns(dev, s, dkv, dn + dv, dkx, qk, tb * H, dn);
  ops::copy_columns(dev, s, dkv + dn, dn + dv, dvx, dv, tb * H, dv);
  add_weight_grad(dev, s, kvw, L, tb, dkv, cc, dwkvb);
  ops::gemm(dev, s, false, false, tb, L, kvw, 1.0f, dkv, kvw, wkvb, L, 0.0f, dc, L);
  ops::fill(dev, s, dkr, tb * dr, 0.0f);
  for (std::int64_t hd = 0; hd < H; ++hd)
    ops::copy_columns(dev, s, dkr, dr, dkx + hd * qk + dn, H * qk, tb, dr, ops::ColumnOrder::same, true);
}

template <class A>
void backward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, const KvGrads& grads, float* dq,
                 const A* dout, const A* q, const KvSource<A>& src, const A* out, const float* lse,
                 const float* given_rd, ThreadPool* pool, RingAttentionStats* stats) {
  check_precision(c.precision, precision_of<A>(), "ring attention", "q, k, v");
  if ((given_rd != nullptr) != c.given_row_dot)
    throw InvalidArgument(std::string("ring attention: ") +
                          (c.given_row_dot ? "given_row_dot needs the caller's row_dot"
                                           : "a row_dot argument needs given_row_dot in the config"));
  const int P = g.size(), m = ring_attention_pieces(c, P);
  const RingAttentionBuffers b = ring_attention_buffers(c, P);
  Stream& s = dev.compute_stream();
  Timer timer(dev, s, stats, m * P);
  const std::int64_t Hq = c.dims.q_heads, Hkv = c.dims.kv_heads, D = c.dims.qk_dim, Dv = c.dims.v_dim;
  const bool latent = c.latent > 0;
  if (P == 1 && !latent) {
    Buffer ws = allocate(dev, b.workspace_backward);
    timer.start();
    if (!timer.skip())
      ops::attention_backward(dev, s, dq, grads.first, grads.second, dout, q, src.first, src.second, out, lse,
                              whole_dims(c), ws.as<float>(), pool, given_rd);
    timer.stop();
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  // The keys are this rank's whole shard; the queries its query piece (packed rows) or the shard.
  const CpShard keys = zigzag_shard(c.seq_len, P, g.rank());
  const CpShard mine = piece_of(keys, c.query_pieces, c.query_piece).shard;
  const bool add_kv = c.query_pieces > 1;  // dk, dv summed over the caller's query pieces
  const std::int64_t T = mine.tokens(), Tmax = widest_piece(c, P, m);
  Buffer kv = allocate(dev, b.kv_ring), ex = allocate(dev, b.expand), tile = allocate(dev, b.tile),
         dkv = allocate(dev, b.dkv_ring), rd = allocate(dev, b.row_dot), ws = allocate(dev, b.workspace_backward);
  const auto [w0, w1] = lane_widths(c);
  const std::int64_t slot = Tmax * (w0 + w1), off = Tmax * w0;
  float* dkvb = dkv.as<float>();
  // After the accumulators' two slots: this rank's part of the block's accumulated
  // value (added once the running value is in), then (compressed form) the block's dK/dV.
  float *part0 = dkvb + 2 * slot, *part1 = part0 + off;
  // (At cp 1 nothing travels: the contribution comes first, then the packed d c | d kr.)
  float* dkx = latent ? dkvb + (P > 1 ? 3 * slot : 0) : nullptr;
  float* dvx = latent ? dkx + Tmax * Hq * D : nullptr;
  // D_i = rowsum(dout * out) once for every hop (or the caller's); dq is added into from zero.
  const float* row_dot = given_rd != nullptr ? given_rd : rd.as<float>();
  if (given_rd == nullptr) {
    timer.start();
    if (!timer.skip()) ops::attention_row_dot(dev, s, rd.as<float>(), dout, out, call_dims(c, T, 0, 0, 0, false));
    timer.stop();
  }
  ops::fill(dev, s, dq, T * Hq * D, 0.0f);
  // One query piece and key chunk pair of the kernel: dq and the block's dK/dV added into.
  const auto attend = [&](const A* kc, const A* vc, float* dkc, float* dvc, const LocalChunk& qc,
                          const LocalChunk& kch, const AttentionDims& d) {
    timer.start();
    if (!timer.skip())
      ops::attention_backward(dev, s, dq + qc.row * Hq * D, dkc + kch.row * Hkv * D, dvc + kch.row * Hkv * Dv,
                              dout + qc.row * Hq * Dv, q + qc.row * Hq * D, kc + kch.row * Hkv * D,
                              vc + kch.row * Hkv * Dv, /*out: D is given*/ nullptr, lse + qc.row * Hq, d,
                              ws.as<float>(), pool, row_dot + qc.row * Hq);
    timer.stop();
  };
  if (P == 1) {
    // The compressed form, nothing travelling: each key piece's dK/dV from every query,
    // contracted at once into its rows of dc and dkr (written straight there with one
    // piece, else through the packed d c | d kr after the contribution).
    float* dcx = dvx + Tmax * Hq * Dv;
    float* drx = dcx + Tmax * w0;
    A* dkv_ex = ex.as<A>() + Tmax * Hq * (D + Dv);
    for (int j = 0; j < m; ++j) {
      const Piece p = piece_of(mine, m, j);
      const std::int64_t tb = p.shard.tokens();
      const LocalBlock<A> blk = local_block(dev, s, c, src, p, m, Tmax, kv.as<A>(), ex.as<A>(), tile.as<float>(), timer);
      ops::fill(dev, s, dkx, tb * Hkv * D, 0.0f);
      ops::fill(dev, s, dvx, tb * Hkv * Dv, 0.0f);
      for_each_call(c, mine, p.shard, [&](const LocalChunk& qc, const LocalChunk& kch, const AttentionDims& d) {
        attend(blk.k, blk.v, dkx, dvx, qc, kch, d);
      });
      timer.start();
      if (!timer.skip())
        contract_block(dev, s, c, tb, dkx, dvx, blk.latent, src.wkvb, dkv_ex, grads.dwkvb, m > 1 ? dcx : grads.first,
                       m > 1 ? drx : grads.second);
      timer.stop();
      if (m > 1) {
        unpack_piece(dev, s, grads.first, dcx, p, w0);
        unpack_piece(dev, s, grads.second, drx, p, w1);
      }
    }
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  std::uint64_t sent = 0;
  for (int j = 0; j < m; ++j) {
    RingExchange ring(dev, g, kTagBackward);
    const std::pair<int, int> lanes = add_carried_lanes(dev, s, ring, c, P, Pass{m, j, Tmax}, kv.as<A>(), src);
    const int acc0 =
        ring.add_accumulated(RingLane{{dkvb, dkvb + slot}, DType::f32, lane_counts(c, P, m, j, w0)});
    const int acc1 =
        ring.add_accumulated(RingLane{{dkvb + off, dkvb + slot + off}, DType::f32, lane_counts(c, P, m, j, w1)});
    for (int hop = 0; hop < P; ++hop) {
      const int at = j * P + hop;
      ring.begin(hop);
      timer.posted(Timer::carried, at);
      const CpShard blk = piece_of(c, P, ring.origin(hop), m, j).shard;
      const std::int64_t tb = blk.tokens();
      const auto [kc, vc] = hop_kv(dev, s, c, ring, lanes, tb, Tmax, ex.as<A>(), tile.as<float>(), src.wkvb, timer);
      // This rank's part of the accumulated value: at hop 0 straight into the travelling
      // accumulator, later into the part, added once the running value is in.
      float* to0 = hop == 0 ? static_cast<float*>(ring.accumulator(acc0)) : part0;
      float* to1 = hop == 0 ? static_cast<float*>(ring.accumulator(acc1)) : part1;
      // The kernel's dK/dV: the part itself, or (compressed form) the block's, contracted below.
      float* dkc = latent ? dkx : to0;
      float* dvc = latent ? dvx : to1;
      ops::fill(dev, s, dkc, tb * Hkv * D, 0.0f);
      ops::fill(dev, s, dvc, tb * Hkv * Dv, 0.0f);
      for_each_call(c, mine, blk, [&](const LocalChunk& qc, const LocalChunk& kch, const AttentionDims& d) {
        attend(kc, vc, dkc, dvc, qc, kch, d);
        ring.progress();
      });
      if (latent) {
        A* dkv_ex = ex.as<A>() + Tmax * Hq * (D + Dv);  // kv_b_proj's output, read by this hop's expansion only
        timer.start();
        if (!timer.skip())
          contract_block(dev, s, c, tb, dkx, dvx, static_cast<const A*>(ring.carried(lanes.first)), src.wkvb,
                         dkv_ex, grads.dwkvb, to0, to1);
        timer.stop();
      }
      progress_while_computing(dev, s, ring);
      if (hop > 0) {
        timer.wait(Timer::accumulated, at, [&] { ring.wait_accumulated(); });
        ops::axpy(dev, s, static_cast<float*>(ring.accumulator(acc0)), part0, tb * w0, 1.0f);
        ops::axpy(dev, s, static_cast<float*>(ring.accumulator(acc1)), part1, tb * w1, 1.0f);
      }
      ring.send_accumulated();
      timer.posted(Timer::accumulated, at);
      timer.wait(Timer::carried, at, [&] { ring.end(hop); });
    }
    // This rank's own piece's complete values come back from the previous rank: straight
    // into dk, dv (one pass: the piece is the shard), or into the lanes' free slots and
    // from there to the piece's rows.
    timer.wait(Timer::finished, j * P + P - 1, [&] {
      if (m == 1 && !add_kv) {
        ring.finish(acc0, grads.first);
        ring.finish(acc1, grads.second);
        return;
      }
      const Piece own = piece_of(keys, m, j);
      unpack_piece(dev, s, grads.first, static_cast<const float*>(ring.finish(acc0)), own, w0, add_kv);
      unpack_piece(dev, s, grads.second, static_cast<const float*>(ring.finish(acc1)), own, w1, add_kv);
    });
    sent += ring.bytes_sent();
  }
  dev.synchronize(s);
  timer.finish(&g);
  if (stats) stats->bytes_sent = sent;
  g_bytes_sent += sent;
}

// The public forms: K/V, then compressed, each for f32 and bf16.
template <class A>
KvSource<A> kv_form(const RingAttentionConfig& c, const A* k, const A* v) {
  if (c.latent != 0) throw InvalidArgument("ring attention: a config with latent > 0 takes the ring_attention_latent_* calls");
  return {k, v, nullptr};
}
template <class A>
KvSource<A> latent_form(const RingAttentionConfig& c, const A* c_lat, const A* kr, const A* wkvb) {
  if (c.latent <= 0) throw InvalidArgument("ring attention: the ring_attention_latent_* calls need latent > 0");
  return {c_lat, kr, wkvb};
}

}  // namespace

void ring_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                            const float* q, const float* k, const float* v, ThreadPool* pool,
                            RingAttentionStats* stats) {
  forward_as<float>(dev, g, c, out, lse, q, kv_form(c, k, v), pool, stats);
}

void ring_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                            const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool, RingAttentionStats* stats) {
  forward_as<bf16>(dev, g, c, out, lse, q, kv_form(c, k, v), pool, stats);
}

void ring_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* row_dot, ThreadPool* pool,
                             RingAttentionStats* stats) {
  backward_as<float>(dev, g, c, {dk, dv, nullptr}, dq, dout, q, kv_form(c, k, v), out, lse, row_dot, pool, stats);
}

void ring_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                             const bf16* out, const float* lse, const float* row_dot, ThreadPool* pool,
                             RingAttentionStats* stats) {
  backward_as<bf16>(dev, g, c, {dk, dv, nullptr}, dq, dout, q, kv_form(c, k, v), out, lse, row_dot, pool, stats);
}

void ring_attention_latent_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out,
                                   float* lse, const float* q, const float* c_lat, const float* kr, const float* wkvb,
                                   ThreadPool* pool, RingAttentionStats* stats) {
  forward_as<float>(dev, g, c, out, lse, q, latent_form(c, c_lat, kr, wkvb), pool, stats);
}

void ring_attention_latent_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out,
                                   float* lse, const bf16* q, const bf16* c_lat, const bf16* kr, const bf16* wkvb,
                                   ThreadPool* pool, RingAttentionStats* stats) {
  forward_as<bf16>(dev, g, c, out, lse, q, latent_form(c, c_lat, kr, wkvb), pool, stats);
}

void ring_attention_latent_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dc,
                                    float* dkr, float* dwkvb, const float* dout, const float* q, const float* c_lat,
                                    const float* kr, const float* wkvb, const float* out, const float* lse,
                                    const float* row_dot, ThreadPool* pool, RingAttentionStats* stats) {
  backward_as<float>(dev, g, c, {dc, dkr, dwkvb}, dq, dout, q, latent_form(c, c_lat, kr, wkvb), out, lse, row_dot, pool,
                     stats);
}

void ring_attention_latent_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dc,
                                    float* dkr, float* dwkvb, const bf16* dout, const bf16* q, const bf16* c_lat,
                                    const bf16* kr, const bf16* wkvb, const bf16* out, const float* lse,
                                    const float* row_dot, ThreadPool* pool, RingAttentionStats* stats) {
  backward_as<bf16>(dev, g, c, {dc, dkr, dwkvb}, dq, dout, q, latent_form(c, c_lat, kr, wkvb), out, lse, row_dot, pool,
                     stats);
}

}  // namespace peakbound
