// Ring attention (schedules/ring_attention.h): the zigzag shards' K/V blocks travel the
// CP ring through RingExchange (two carried lanes, K and V, in one kv_ring buffer); each
// hop folds the block into this rank's queries with the kernel's accumulate mode, one
// call per (query piece, key chunk) pair with at least one visible key, the ring's
// transfers progressed between calls. The backward
// sends the blocks round again with two accumulated lanes (dK, dV, in dkv_ring with one
// block's contribution), and dq is added into across hops from D_i computed once.
#include "peakbound/schedules/ring_attention.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
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

// Elements origin rank o's set of a lane holds: its shard's tokens x `width`, per rank.
std::vector<std::size_t> lane_counts(std::int64_t S, int cp, std::int64_t width) {
  std::vector<std::size_t> n(static_cast<std::size_t>(cp));
  for (int o = 0; o < cp; ++o) n[static_cast<std::size_t>(o)] = static_cast<std::size_t>(zigzag_shard(S, cp, o).tokens() * width);
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

// Stream timestamps around kernel calls, and the ring's blocking waits with the times
// the data they wait for was posted by the previous rank (RingAttentionStats), or nothing.
class Timer {
 public:
  enum Kind { carried, accumulated, finished };
  Timer(Device& dev, Stream& s, RingAttentionStats* st, int P)
      : dev_(dev), s_(s), st_(st), t0_(now()), carried_post_(static_cast<std::size_t>(P), 0.0),
        acc_post_(static_cast<std::size_t>(P), 0.0) {
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
    std::vector<double> mine(carried_post_), prev(2 * static_cast<std::size_t>(P));
    mine.insert(mine.end(), acc_post_.begin(), acc_post_.end());
    g->sendrecv(mine.data(), mine.size(), (r + 1) % P, prev.data(), prev.size(), (r - 1 + P) % P, DType::f64, kTagStats);
    for (const Wait& w : waits_) {
      // The previous rank's send this wait receives: hop h's carried data (posted in
      // its begin(h)); the running value for hop h (its send_accumulated at h - 1); the
      // own complete value (its send_accumulated at the last hop).
      const std::size_t at = w.kind == carried ? static_cast<std::size_t>(w.hop)
                           : w.kind == accumulated ? static_cast<std::size_t>(P + w.hop - 1)
                                                   : static_cast<std::size_t>(2 * P - 1);
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
}

RingAttentionBuffers ring_attention_buffers(const RingAttentionConfig& c, int cp) {
  check_ring_attention(c, cp);
  const AttentionDims& d = c.dims;
  // Under bf16 the carried K/V lanes are bf16 and the kernel's tiles need bf16 room; the
  // accumulators and row_dot stay fp32.
  const DType a = activation_dtype(c.precision);
  RingAttentionBuffers b;
  b.kv_ring = b.dkv_ring = b.row_dot = buffer_spec(kC, 0, kF32);
  if (cp == 1) {
    // Nothing moves: the single-rank kernel, D_i in its own workspace.
    const AttentionDims w = whole_dims(c);
    b.workspace_forward = buffer_spec(kC, U(attention_forward_workspace_floats(w, a)), kF32);
    b.workspace_backward = buffer_spec(kC, U(attention_backward_workspace_floats(w, false, a)), kF32);
    return b;
  }
  const std::uint64_t T = U(zigzag_widest_tokens(c.seq_len, cp));
  const std::uint64_t block = checked_mul(checked_mul(T, U(d.kv_heads), "ring attention"),
                                          checked_add(U(d.qk_dim), U(d.v_dim), "ring attention"), "ring attention");
  b.kv_ring = buffer_spec(kC, checked_mul(2, block, "ring attention"), dtype_size(a));
  b.dkv_ring = buffer_spec(kC, checked_mul(3, block, "ring attention"), kF32);
  b.row_dot = buffer_spec(kC, checked_mul(T, U(d.q_heads), "ring attention"), kF32);
  b.workspace_forward = buffer_spec(kC, U(attention_forward_workspace_floats(d, a)), kF32);
  b.workspace_backward = buffer_spec(kC, U(attention_backward_workspace_floats(d, true, a)), kF32);
  return b;
}

Footprint ring_attention_footprint(const RingAttentionConfig& c, int cp) {
  const RingAttentionBuffers b = ring_attention_buffers(c, cp);
  Footprint f("ring_attention");
  f.device("forward", b.kv_ring).device("forward", b.workspace_forward);
  f.device("backward", b.kv_ring).device("backward", b.dkv_ring).device("backward", b.row_dot);
  f.device("backward", b.workspace_backward);
  return f;
}

namespace {

// Written once for A = float | bf16 (q, k, v, dout, out and the carried lanes); A = float
// is the f32-only code's calls in its order.
template <class A>
void forward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse, const A* q,
                const A* k, const A* v, ThreadPool* pool, RingAttentionStats* stats) {
  check_precision(c.precision, precision_of<A>(), "ring attention", "q, k, v");
  const int P = g.size();
  const RingAttentionBuffers b = ring_attention_buffers(c, P);
  Stream& s = dev.compute_stream();
  Timer timer(dev, s, stats, P);
  const std::int64_t Hq = c.dims.q_heads, Hkv = c.dims.kv_heads, D = c.dims.qk_dim, Dv = c.dims.v_dim;
  Buffer ws = allocate(dev, b.workspace_forward);
  if (P == 1) {
    timer.start();
    if (!timer.skip()) ops::attention_forward(dev, s, out, lse, q, k, v, whole_dims(c), ws.as<float>(), pool);
    timer.stop();
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  const CpShard mine = zigzag_shard(c.seq_len, P, g.rank());
  const std::int64_t T = mine.tokens(), Tmax = zigzag_widest_tokens(c.seq_len, P);
  Buffer kv = allocate(dev, b.kv_ring);
  A* base = kv.as<A>();
  constexpr DType kA = dtype_of<A>();
  const std::int64_t block = Tmax * Hkv * (D + Dv);
  const std::vector<std::size_t> k_count = lane_counts(c.seq_len, P, Hkv * D), v_count = lane_counts(c.seq_len, P, Hkv * Dv);
  RingExchange ring(dev, g, kTagForward);
  const int k_lane = ring.add_carried(k, RingLane{{base, base + block}, kA, k_count});
  const int v_lane = ring.add_carried(v, RingLane{{base + Tmax * Hkv * D, base + block + Tmax * Hkv * D}, kA, v_count});
  // Every row starts empty (lse -inf: out is not read).
  ops::fill(dev, s, lse, T * Hq, kNegInf);
  for (int hop = 0; hop < P; ++hop) {
    ring.begin(hop);
    timer.posted(Timer::carried, hop);
    const CpShard blk = zigzag_shard(c.seq_len, P, ring.origin(hop));
    const A* kc = static_cast<const A*>(ring.carried(k_lane));
    const A* vc = static_cast<const A*>(ring.carried(v_lane));
    for (const LocalChunk& qc : query_pieces(mine, c.dims.block_q))
      for (const LocalChunk& kch : chunks_of(blk)) {
        if (!pair_visible(qc.c, kch.c, c.dims.window)) continue;
        const AttentionDims d = call_dims(c, qc.c.len, qc.c.begin, kch.c.len, kch.c.begin, true);
        timer.start();
        if (!timer.skip())
          ops::attention_forward(dev, s, out + qc.row * Hq * Dv, lse + qc.row * Hq, q + qc.row * Hq * D,
                                 kc + kch.row * Hkv * D, vc + kch.row * Hkv * Dv, d, ws.as<float>(), pool);
        timer.stop();
        ring.progress();
      }
    progress_while_computing(dev, s, ring);
    timer.wait(Timer::carried, hop, [&] { ring.end(hop); });
  }
  dev.synchronize(s);
  timer.finish(&g);
}

template <class A>
void backward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk, float* dv,
                 const A* dout, const A* q, const A* k, const A* v, const A* out, const float* lse, ThreadPool* pool,
                 RingAttentionStats* stats) {
  check_precision(c.precision, precision_of<A>(), "ring attention", "q, k, v");
  const int P = g.size();
  const RingAttentionBuffers b = ring_attention_buffers(c, P);
  Stream& s = dev.compute_stream();
  Timer timer(dev, s, stats, P);
  const std::int64_t Hq = c.dims.q_heads, Hkv = c.dims.kv_heads, D = c.dims.qk_dim, Dv = c.dims.v_dim;
  if (P == 1) {
    Buffer ws = allocate(dev, b.workspace_backward);
    timer.start();
    if (!timer.skip())
      ops::attention_backward(dev, s, dq, dk, dv, dout, q, k, v, out, lse, whole_dims(c), ws.as<float>(), pool);
    timer.stop();
    dev.synchronize(s);
    timer.finish(nullptr);
    return;
  }
  const CpShard mine = zigzag_shard(c.seq_len, P, g.rank());
  const std::int64_t T = mine.tokens(), Tmax = zigzag_widest_tokens(c.seq_len, P);
  Buffer kv = allocate(dev, b.kv_ring), dkv = allocate(dev, b.dkv_ring), rd = allocate(dev, b.row_dot),
         ws = allocate(dev, b.workspace_backward);
  const std::int64_t block = Tmax * Hkv * (D + Dv), k_part = Tmax * Hkv * D;
  A* kvb = kv.as<A>();
  float* dkvb = dkv.as<float>();
  constexpr DType kA = dtype_of<A>();
  float *dk_part = dkvb + 2 * block, *dv_part = dk_part + k_part;  // one block's contribution
  const std::vector<std::size_t> k_count = lane_counts(c.seq_len, P, Hkv * D), v_count = lane_counts(c.seq_len, P, Hkv * Dv);
  RingExchange ring(dev, g, kTagBackward);
  const int k_lane = ring.add_carried(k, RingLane{{kvb, kvb + block}, kA, k_count});
  const int v_lane = ring.add_carried(v, RingLane{{kvb + k_part, kvb + block + k_part}, kA, v_count});
  const int dk_lane = ring.add_accumulated(RingLane{{dkvb, dkvb + block}, DType::f32, k_count});
  const int dv_lane = ring.add_accumulated(RingLane{{dkvb + k_part, dkvb + block + k_part}, DType::f32, v_count});
  // D_i = rowsum(dout * out) once for every hop; dq is added into from zero.
  timer.start();
  if (!timer.skip()) ops::attention_row_dot(dev, s, rd.as<float>(), dout, out, call_dims(c, T, 0, 0, 0, false));
  timer.stop();
  ops::fill(dev, s, dq, T * Hq * D, 0.0f);
  for (int hop = 0; hop < P; ++hop) {
    ring.begin(hop);
    timer.posted(Timer::carried, hop);
    const CpShard blk = zigzag_shard(c.seq_len, P, ring.origin(hop));
    const std::int64_t tb = blk.tokens();
    const A* kc = static_cast<const A*>(ring.carried(k_lane));
    const A* vc = static_cast<const A*>(ring.carried(v_lane));
    // This rank's part of the block's dK/dV: at hop 0 straight into the travelling
    // accumulator, later into the contribution, added once the running value is in.
    float* dkc = hop == 0 ? static_cast<float*>(ring.accumulator(dk_lane)) : dk_part;
    float* dvc = hop == 0 ? static_cast<float*>(ring.accumulator(dv_lane)) : dv_part;
    ops::fill(dev, s, dkc, tb * Hkv * D, 0.0f);
    ops::fill(dev, s, dvc, tb * Hkv * Dv, 0.0f);
    for (const LocalChunk& qc : query_pieces(mine, c.dims.block_q))
      for (const LocalChunk& kch : chunks_of(blk)) {
        if (!pair_visible(qc.c, kch.c, c.dims.window)) continue;
        const AttentionDims d = call_dims(c, qc.c.len, qc.c.begin, kch.c.len, kch.c.begin, true);
        timer.start();
        if (!timer.skip())
          ops::attention_backward(dev, s, dq + qc.row * Hq * D, dkc + kch.row * Hkv * D, dvc + kch.row * Hkv * Dv,
                                  dout + qc.row * Hq * Dv, q + qc.row * Hq * D, kc + kch.row * Hkv * D,
                                  vc + kch.row * Hkv * Dv, out + qc.row * Hq * Dv, lse + qc.row * Hq, d,
                                  ws.as<float>(), pool, rd.as<float>() + qc.row * Hq);
        timer.stop();
        ring.progress();
      }
    progress_while_computing(dev, s, ring);
    if (hop > 0) {
      timer.wait(Timer::accumulated, hop, [&] { ring.wait_accumulated(); });
      ops::axpy(dev, s, static_cast<float*>(ring.accumulator(dk_lane)), dk_part, tb * Hkv * D, 1.0f);
      ops::axpy(dev, s, static_cast<float*>(ring.accumulator(dv_lane)), dv_part, tb * Hkv * Dv, 1.0f);
    }
    ring.send_accumulated();
    timer.posted(Timer::accumulated, hop);
    timer.wait(Timer::carried, hop, [&] { ring.end(hop); });
  }
  // This rank's own blocks' complete dK/dV come back from the previous rank.
  timer.wait(Timer::finished, P - 1, [&] {
    ring.finish(dk_lane, dk);
    ring.finish(dv_lane, dv);
  });
  dev.synchronize(s);
  timer.finish(&g);
}

}  // namespace

void ring_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                            const float* q, const float* k, const float* v, ThreadPool* pool,
                            RingAttentionStats* stats) {
  forward_as<float>(dev, g, c, out, lse, q, k, v, pool, stats);
}

void ring_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                            const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool, RingAttentionStats* stats) {
  forward_as<bf16>(dev, g, c, out, lse, q, k, v, pool, stats);
}

void ring_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, ThreadPool* pool, RingAttentionStats* stats) {
  backward_as<float>(dev, g, c, dq, dk, dv, dout, q, k, v, out, lse, pool, stats);
}

void ring_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                             const bf16* out, const float* lse, ThreadPool* pool, RingAttentionStats* stats) {
  backward_as<bf16>(dev, g, c, dq, dk, dv, dout, q, k, v, out, lse, pool, stats);
}

}  // namespace peakbound
