// Ulysses attention (schedules/ulysses_attention.h): per KV head step, two all-to-alls
// out (one per zigzag chunk: the owner receives every rank's chunk rows straight at their
// place), the single-rank kernel per received query run, two all-to-alls back.
#include "peakbound/schedules/ulysses_attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/schedules/context_layout.h"

namespace peakbound {

namespace {

constexpr Component kC = Component::attention;
constexpr std::uint64_t kF32 = sizeof(float);

std::uint64_t U(std::int64_t v) { return static_cast<std::uint64_t>(v); }
std::size_t Z(std::int64_t v) { return static_cast<std::size_t>(v); }

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

// Every call's sends to other ranks in this process (ulysses_attention_bytes_sent).
std::atomic<std::uint64_t> g_bytes_sent{0};

// A run of rows one rank holds: `n` rows from its local row `row`, at global position `at`.
struct Run {
  std::int64_t row = 0, n = 0, at = 0;
};
using Runs = std::vector<std::array<Run, 2>>;  // per rank of the group: its two runs
std::int64_t rows_of(const std::array<Run, 2>& r) { return r[0].n + r[1].n; }

// The keys' runs: every rank's two zigzag chunks (local rows of its whole shard).
Runs key_runs(std::int64_t S, int cp) {
  Runs r(Z(cp));
  for (int o = 0; o < cp; ++o) {
    const CpShard sh = zigzag_shard(S, cp, o);
    r[Z(o)] = {Run{0, sh.first.len, sh.first.begin}, Run{sh.first.len, sh.second.len, sh.second.begin}};
  }
  return r;
}

// The queries' runs of query piece j of m: each rank's parts of its two chunks (local rows
// of the packed piece: the first part, then the second).
Runs query_runs(std::int64_t S, int cp, int m, int j) {
  Runs r(Z(cp));
  for (int o = 0; o < cp; ++o) {
    const CpShard sh = zigzag_shard(S, cp, o);
    const RingQueryRows q = ring_query_rows(S, cp, o, m, j);
    r[Z(o)] = {Run{0, q.n0, sh.position(q.row0)}, Run{q.n0, q.n1, q.n1 > 0 ? sh.position(q.row1) : 0}};
  }
  return r;
}

// Where the owner of the heads puts rank o's run u of the queries: packed, every rank's
// first runs in rank order, then every rank's second runs.
std::int64_t gathered_row(const Runs& r, int o, int u) {
  std::int64_t at = 0;
  for (std::size_t p = 0; p < r.size(); ++p) {
    if (u == 1) at += r[p][0].n;
    if (static_cast<int>(p) < o) at += r[p][Z(u)].n;
  }
  return at;
}
std::int64_t gathered_rows(const Runs& r) {
  std::int64_t n = 0;
  for (const auto& x : r) n += rows_of(x);
  return n;
}

// The widest of a call's gathered queries and of one rank's piece, over the pieces.
struct QuerySizes {
  std::int64_t gathered = 0, piece = 0;
};
QuerySizes query_sizes(const RingAttentionConfig& c, int cp) {
  QuerySizes z;
  for (int j = 0; j < c.query_pieces; ++j) {
    const Runs r = query_runs(c.seq_len, cp, c.query_pieces, j);
    z.gathered = std::max(z.gathered, gathered_rows(r));
    for (const auto& x : r) z.piece = std::max(z.piece, rows_of(x));
  }
  return z;
}

// Which heads a rank takes at each step. cp dividing Hkv: hk = Hkv / cp steps, at step t
// KV head d hk + t and its Hq / Hkv query heads. Hkv dividing cp (replicated): one step,
// query heads d g .. d g + g - 1 (g = Hq / cp) and the one KV head they read, which
// cp / Hkv ranks then share (each takes its K/V; their dK/dV are summed at the owner).
struct Heads {
  std::int64_t hk = 0, g = 0, D = 0, Dv = 0;
  std::int64_t per_kv = 0;  // Hq / Hkv
  bool replicated = false;
  std::int64_t q_head(int d, int t) const { return replicated ? d * g : (d * hk + t) * g; }
  std::int64_t kv_head(int d, int t) const { return replicated ? q_head(d, t) / per_kv : d * hk + t; }
};
Heads heads_of(const RingAttentionConfig& c, int cp) {
  Heads h;
  h.D = c.dims.qk_dim;
  h.Dv = c.dims.v_dim;
  h.per_kv = c.dims.q_heads / c.dims.kv_heads;
  h.replicated = c.dims.kv_heads % cp != 0;
  h.hk = h.replicated ? 1 : c.dims.kv_heads / cp;
  h.g = h.replicated ? c.dims.q_heads / cp : h.per_kv;
  return h;
}

void exchange(Device& dev, Stream& s, Communicator& g, const void* send, const std::vector<std::size_t>& sc,
              const std::vector<std::size_t>& sd, void* recv, const std::vector<std::size_t>& rc,
              const std::vector<std::size_t>& rd, DType t) {
  dev.synchronize(s);  // the packed sends are written; the receives' readers come after
  g.all_to_all_v(send, sc, sd, recv, rc, rd, t);
  std::size_t n = 0;
  for (std::size_t d = 0; d < sc.size(); ++d)
    if (static_cast<int>(d) != g.rank()) n += sc[d];
  g_bytes_sent += n * dtype_size(t);
}

// Out: run u of this rank's rows of src ([*, lds]), columns [col(d), col(d) + w) to each
// rank d (packed in stage); rank o's run u lands in dst ([*, w]) at row at(o).
template <class T, class Col, class At>
void to_sequence(Device& dev, Stream& s, Communicator& g, const T* src, std::int64_t lds, const Runs& runs, int u,
                 std::int64_t w, Col col, At at, T* stage, T* dst) {
  const int cp = g.size();
  const Run& mine = runs[Z(g.rank())][Z(u)];
  std::vector<std::size_t> sc(Z(cp)), rc(Z(cp)), rd(Z(cp));
  for (int d = 0; d < cp; ++d) {
    if (mine.n > 0)
      ops::copy_columns(dev, s, stage + d * mine.n * w, w, src + mine.row * lds + col(d), lds, mine.n, w);
    sc[Z(d)] = Z(mine.n * w);
  }
  for (int o = 0; o < cp; ++o) {
    rc[Z(o)] = Z(runs[Z(o)][Z(u)].n * w);
    rd[Z(o)] = Z(at(o) * w);
  }
  exchange(dev, s, g, stage, sc, packed_displs(sc), dst, rc, rd, dtype_of<T>());
}

// Back: rank o's run u sits in src ([*, w]) at row at(o) and goes back to o, which writes
// (add: adds) what rank d sends into columns [col(d), col(d) + w) of its run's rows of dst
// ([*, ldd]).
template <class T, class Col, class At>
void to_heads(Device& dev, Stream& s, Communicator& g, const T* src, const Runs& runs, int u, std::int64_t w, At at,
              Col col, T* stage, T* dst, std::int64_t ldd, bool add) {
  const int cp = g.size();
  const Run& mine = runs[Z(g.rank())][Z(u)];
  std::vector<std::size_t> sc(Z(cp)), sd(Z(cp)), rc(Z(cp), Z(mine.n * w));
  for (int o = 0; o < cp; ++o) {
    sc[Z(o)] = Z(runs[Z(o)][Z(u)].n * w);
    sd[Z(o)] = Z(at(o) * w);
  }
  exchange(dev, s, g, src, sc, sd, stage, rc, packed_displs(rc), dtype_of<T>());
  if (mine.n == 0) return;
  for (int d = 0; d < cp; ++d)
    ops::copy_columns(dev, s, dst + mine.row * ldd + col(d), ldd, stage + d * mine.n * w, w, mine.n, w,
                      ops::ColumnOrder::same, add);
}

// The kernel's dims for one gathered query run: n rows of g heads at global position p
// against one KV head's keys 0 .. p + n - 1.
AttentionDims run_dims(const RingAttentionConfig& c, const Heads& h, std::int64_t n, std::int64_t p, bool accumulate) {
  AttentionDims d = c.dims;
  d.tokens = n;
  d.q_heads = h.g;
  d.kv_heads = 1;
  d.kv_tokens = p + n;
  d.q_offset = p;
  d.k_offset = 0;
  d.accumulate = accumulate;
  return d;
}

// f(gathered row, run) for every non-empty query run.
template <class F>
void for_each_run(const Runs& q, F&& f) {
  for (int u = 0; u < 2; ++u)
    for (int o = 0; o < static_cast<int>(q.size()); ++o)
      if (q[Z(o)][Z(u)].n > 0) f(gathered_row(q, o, u), q[Z(o)][Z(u)]);
}

// The plumbing shared by the two passes: the heads a step takes, the runs, the gathered rows.
struct Step {
  const RingAttentionConfig& c;
  Heads h;
  Runs q, k;
  std::int64_t R;
  Step(const RingAttentionConfig& cfg, int cp)
      : c(cfg), h(heads_of(cfg, cp)), q(query_runs(cfg.seq_len, cp, cfg.query_pieces, cfg.query_piece)),
        k(key_runs(cfg.seq_len, cp)), R(gathered_rows(q)) {}
};

// The keys' side for step t: every rank's k and v rows of the step's KV head, at their
// global positions in ku [S, D] and vu [S, Dv].
template <class A>
void gather_kv(Device& dev, Stream& s, Communicator& g, const Step& st, int t, const A* k, const A* v, A* stage,
               A* ku, A* vu) {
  const Heads& h = st.h;
  const std::int64_t Kw = st.c.dims.kv_heads * h.D, Vw = st.c.dims.kv_heads * h.Dv;
  const auto at = [&](int u) { return [&st, u](int o) { return st.k[Z(o)][Z(u)].at; }; };
  for (int u = 0; u < 2; ++u) {
    to_sequence(dev, s, g, k, Kw, st.k, u, h.D, [&](int d) { return st.h.kv_head(d, t) * h.D; }, at(u), stage, ku);
    to_sequence(dev, s, g, v, Vw, st.k, u, h.Dv, [&](int d) { return st.h.kv_head(d, t) * h.Dv; }, at(u), stage, vu);
  }
}
// Query-side tensor x ([P, heads x w] of this call's rows) for step t into xu ([R, g x w]).
template <class T>
void gather_queries(Device& dev, Stream& s, Communicator& g, const Step& st, int t, const T* x, std::int64_t w,
                    T* stage, T* xu) {
  const std::int64_t ld = st.c.dims.q_heads * w, gw = st.h.g * w;
  for (int u = 0; u < 2; ++u)
    to_sequence(dev, s, g, x, ld, st.q, u, gw, [&](int d) { return st.h.q_head(d, t) * w; },
                [&st, u](int o) { return gathered_row(st.q, o, u); }, stage, xu);
}
// The gathered queries' results xu ([R, g x w], f32) for step t back into x ([P, heads x w]).
void scatter_queries(Device& dev, Stream& s, Communicator& g, const Step& st, int t, const float* xu,
                     std::int64_t w, float* stage, float* x) {
  const std::int64_t ld = st.c.dims.q_heads * w, gw = st.h.g * w;
  for (int u = 0; u < 2; ++u)
    to_heads(dev, s, g, xu, st.q, u, gw, [&st, u](int o) { return gathered_row(st.q, o, u); },
             [&](int d) { return st.h.q_head(d, t) * w; }, stage, x, ld, false);
}

template <class A>
void forward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse, const A* q,
                const A* k, const A* v, ThreadPool* pool) {
  const int cp = g.size();
  const UlyssesAttentionBuffers b = ulysses_attention_buffers(c, cp);
  const Step st(c, cp);
  const Heads& h = st.h;
  Stream& s = dev.compute_stream();
  Buffer stage = allocate(dev, b.stage), qb = allocate(dev, b.q), kv = allocate(dev, b.kv), ob = allocate(dev, b.out),
         lb = allocate(dev, b.lse), ws = allocate(dev, b.workspace_forward);
  A *qu = qb.as<A>(), *ku = kv.as<A>(), *vu = ku + c.seq_len * h.D;
  float *ou = ob.as<float>(), *lu = lb.as<float>();
  for (int t = 0; t < h.hk; ++t) {
    gather_queries(dev, s, g, st, t, q, h.D, stage.as<A>(), qu);
    gather_kv(dev, s, g, st, t, k, v, stage.as<A>(), ku, vu);
    for_each_run(st.q, [&](std::int64_t r, const Run& run) {
      ops::attention_forward(dev, s, ou + r * h.g * h.Dv, lu + r * h.g, qu + r * h.g * h.D, ku, vu,
                             run_dims(c, h, run.n, run.at, false), ws.as<float>(), pool);
    });
    scatter_queries(dev, s, g, st, t, ou, h.Dv, stage.as<float>(), out);
    scatter_queries(dev, s, g, st, t, lu, 1, stage.as<float>(), lse);
  }
  dev.synchronize(s);
}

template <class A>
void backward_as(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk, float* dv,
                 const A* dout, const A* q, const A* k, const A* v, const A* out, const float* lse,
                 const float* row_dot, ThreadPool* pool) {
  const int cp = g.size();
  const UlyssesAttentionBuffers b = ulysses_attention_buffers(c, cp);
  const Step st(c, cp);
  const Heads& h = st.h;
  const std::int64_t S = c.seq_len, P = rows_of(st.q[Z(g.rank())]), T = rows_of(st.k[Z(g.rank())]);
  Stream& s = dev.compute_stream();
  Buffer stage = allocate(dev, b.stage), qb = allocate(dev, b.q), kv = allocate(dev, b.kv), db = allocate(dev, b.d_o),
         lb = allocate(dev, b.lse_and_d), dqb = allocate(dev, b.dq), dkvb = allocate(dev, b.dkv), rdb = allocate(dev, b.row_dot),
         ws = allocate(dev, b.workspace_backward);
  if (!c.given_row_dot) {
    AttentionDims d = c.dims;
    d.tokens = P;
    ops::attention_row_dot(dev, s, rdb.as<float>(), dout, out, d);
    row_dot = rdb.as<float>();
  }
  A *qu = qb.as<A>(), *ku = kv.as<A>(), *vu = ku + S * h.D, *du = db.as<A>();
  float *lu = lb.as<float>(), *ru = lu + st.R * h.g, *dqu = dqb.as<float>(), *dku = dkvb.as<float>(),
        *dvu = dku + S * h.D;
  // A replicated KV head's dK/dV come from several ranks: summed into zeroed ones.
  const bool add = c.query_pieces > 1 || h.replicated;
  if (h.replicated && c.query_pieces == 1) {
    ops::fill(dev, s, dk, T * c.dims.kv_heads * h.D, 0.0f);
    ops::fill(dev, s, dv, T * c.dims.kv_heads * h.Dv, 0.0f);
  }
  const std::int64_t Kw = c.dims.kv_heads * h.D, Vw = c.dims.kv_heads * h.Dv;
  for (int t = 0; t < h.hk; ++t) {
    gather_queries(dev, s, g, st, t, q, h.D, stage.as<A>(), qu);
    gather_queries(dev, s, g, st, t, dout, h.Dv, stage.as<A>(), du);
    gather_queries(dev, s, g, st, t, lse, 1, stage.as<float>(), lu);
    gather_queries(dev, s, g, st, t, row_dot, 1, stage.as<float>(), ru);
    gather_kv(dev, s, g, st, t, k, v, stage.as<A>(), ku, vu);
    ops::fill(dev, s, dqu, st.R * h.g * h.D, 0.0f);
    ops::fill(dev, s, dku, S * (h.D + h.Dv), 0.0f);
    for_each_run(st.q, [&](std::int64_t r, const Run& run) {
      ops::attention_backward(dev, s, dqu + r * h.g * h.D, dku, dvu, du + r * h.g * h.Dv, qu + r * h.g * h.D, ku, vu,
                              nullptr, lu + r * h.g, run_dims(c, h, run.n, run.at, true), ws.as<float>(), pool,
                              ru + r * h.g);
    });
    scatter_queries(dev, s, g, st, t, dqu, h.D, stage.as<float>(), dq);
    for (int u = 0; u < 2; ++u) {
      const auto at = [&st, u](int o) { return st.k[Z(o)][Z(u)].at; };
      to_heads(dev, s, g, static_cast<const float*>(dku), st.k, u, h.D, at,
               [&](int d) { return st.h.kv_head(d, t) * h.D; }, stage.as<float>(), dk, Kw, add);
      to_heads(dev, s, g, static_cast<const float*>(dvu), st.k, u, h.Dv, at,
               [&](int d) { return st.h.kv_head(d, t) * h.Dv; }, stage.as<float>(), dv, Vw, add);
    }
  }
  dev.synchronize(s);
}

}  // namespace

std::uint64_t ulysses_attention_bytes_sent() { return g_bytes_sent.load(); }

const char* context_attention_name(ContextAttention a) { return a == ContextAttention::ulysses ? "ulysses" : "ring"; }

std::string ulysses_refusal(std::int64_t q_heads, std::int64_t kv_heads, int cp, bool mla) {
  if (mla) return "Ulysses attention splits K/V heads; MLA's context parallelism is its latent ring";
  if (cp < 1 || kv_heads < 1) return "Ulysses attention needs cp >= 1 and KV heads";
  if (kv_heads % cp == 0) return {};
  if (cp % kv_heads == 0 && q_heads % cp == 0) return {};
  return "Ulysses attention splits the heads over the " + std::to_string(cp) + " context-parallel ranks: cp must " +
         "divide the " + std::to_string(kv_heads) + " KV heads, or be a multiple of them that divides the " +
         std::to_string(q_heads) + " query heads";
}

void check_ulysses_attention(const RingAttentionConfig& c, int cp) {
  if (c.latent != 0) throw InvalidArgument("Ulysses attention: the K/V form only (latent must be 0)");
  RingAttentionConfig r = c;
  r.piece_tokens = 0;  // the K/V go whole: the ring's piece checks do not apply
  // The ring refuses query pieces at cp 1; here they are the same cut at any cp.
  if (cp == 1) r.query_pieces = 1, r.query_piece = 0;
  check_ring_attention(r, cp);
  if (cp == 1 && (c.query_pieces < 1 || c.query_piece < 0 || c.query_piece >= c.query_pieces ||
                  c.query_pieces > zigzag_shortest_chunk(c.seq_len, 1)))
    throw InvalidArgument("Ulysses attention: query_piece must be in [0, query_pieces), query_pieces in [1, S / 2]");
  if (const std::string why = ulysses_refusal(c.dims.q_heads, c.dims.kv_heads, cp); !why.empty())
    throw InvalidArgument(why);
}

UlyssesAttentionBuffers ulysses_attention_buffers(const RingAttentionConfig& c, int cp) {
  check_ulysses_attention(c, cp);
  const auto mul = [](std::uint64_t x, std::uint64_t y) { return checked_mul(x, y, "Ulysses attention"); };
  const Heads h = heads_of(c, cp);
  const std::uint64_t a = dtype_size(activation_dtype(c.precision));
  const QuerySizes z = query_sizes(c, cp);
  const std::uint64_t R = U(z.gathered), P = U(z.piece), S = U(c.seq_len);
  const std::uint64_t T = U(zigzag_widest_tokens(c.seq_len, cp)), g = U(h.g), D = U(h.D), Dv = U(h.Dv);
  const std::uint64_t n = U(cp);
  // The stage holds one run's packed exchange at a time: a call's query rows of g heads for
  // every rank (q, dout out; out, lse, dq back in f32) or its shard's of one KV head (k, v
  // out; dk, dv back in f32). Sized for the whole rows of the widest piece and shard.
  const std::uint64_t query_side = mul(mul(P, n), mul(g, std::max({D * a, Dv * a, Dv * kF32, D * kF32})));
  const std::uint64_t key_side = mul(mul(T, n), std::max(D, Dv) * kF32);
  UlyssesAttentionBuffers b;
  b.stage = buffer_spec(kC, std::max(query_side, key_side), 1);
  b.q = buffer_spec(kC, mul(R, g * D), a);
  b.kv = buffer_spec(kC, mul(S, D + Dv), a);
  b.out = buffer_spec(kC, mul(R, g * Dv), kF32);
  b.lse = buffer_spec(kC, mul(R, g), kF32);
  b.lse_and_d = buffer_spec(kC, mul(R, 2 * g), kF32);
  b.d_o = buffer_spec(kC, mul(R, g * Dv), a);
  b.dq = buffer_spec(kC, mul(R, g * D), kF32);
  b.dkv = buffer_spec(kC, mul(S, D + Dv), kF32);
  b.row_dot = buffer_spec(kC, c.given_row_dot ? 0 : mul(P, U(c.dims.q_heads)), kF32);
  AttentionDims d = run_dims(c, h, z.gathered, 0, false);
  const DType act = activation_dtype(c.precision);
  b.workspace_forward = buffer_spec(kC, U(attention_forward_workspace_floats(d, act)), kF32);
  b.workspace_backward = buffer_spec(kC, U(attention_backward_workspace_floats(d, true, act)), kF32);
  return b;
}

Footprint ulysses_attention_footprint(const RingAttentionConfig& c, int cp) {
  const UlyssesAttentionBuffers b = ulysses_attention_buffers(c, cp);
  Footprint f("ulysses_attention");
  f.device("forward", b.stage).device("forward", b.q).device("forward", b.kv).device("forward", b.out);
  f.device("forward", b.lse).device("forward", b.workspace_forward);
  f.device("backward", b.stage).device("backward", b.q).device("backward", b.kv).device("backward", b.d_o);
  f.device("backward", b.lse_and_d).device("backward", b.dq).device("backward", b.dkv);
  f.device("backward", b.row_dot).device("backward", b.workspace_backward);
  return f;
}

RingAttentionTraffic ulysses_attention_traffic(const RingAttentionConfig& c, int cp, int rank) {
  check_ulysses_attention(c, cp);
  if (rank < 0 || rank >= cp)
    throw InvalidArgument("Ulysses attention: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(cp) +
                          ")");
  const Heads h = heads_of(c, cp);
  const std::uint64_t a = dtype_size(activation_dtype(c.precision));
  const Runs q = query_runs(c.seq_len, cp, c.query_pieces, c.query_piece), k = key_runs(c.seq_len, cp);
  // Per step and per other rank: this rank's rows out, the rows it gathered from it back.
  std::uint64_t mq = 0, mk = 0, oq = 0, ok = 0;
  for (int o = 0; o < cp; ++o) {
    if (o == rank) continue;
    mq += U(rows_of(q[Z(rank)]));
    mk += U(rows_of(k[Z(rank)]));
    oq += U(rows_of(q[Z(o)]));
    ok += U(rows_of(k[Z(o)]));
  }
  const std::uint64_t g = U(h.g), D = U(h.D), Dv = U(h.Dv), steps = U(h.hk);
  RingAttentionTraffic t;
  t.forward = steps * (mq * g * D * a + mk * (D + Dv) * a + oq * g * (Dv + 1) * kF32);
  t.backward = steps * (mq * g * ((D + Dv) * a + 2 * kF32) + mk * (D + Dv) * a + oq * g * D * kF32 +
                        ok * (D + Dv) * kF32);
  return t;
}

void ulysses_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                               const float* q, const float* k, const float* v, ThreadPool* pool) {
  if (c.precision != Precision::f32) throw InvalidArgument("Ulysses attention runs in bf16 but was given f32 q, k, v");
  forward_as(dev, g, c, out, lse, q, k, v, pool);
}
void ulysses_attention_forward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* out, float* lse,
                               const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool) {
  if (c.precision != Precision::bf16) throw InvalidArgument("Ulysses attention runs in f32 but was given bf16 q, k, v");
  forward_as(dev, g, c, out, lse, q, k, v, pool);
}
void ulysses_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                                float* dv, const float* dout, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* row_dot, ThreadPool* pool) {
  if (c.precision != Precision::f32) throw InvalidArgument("Ulysses attention runs in bf16 but was given f32 q, k, v");
  backward_as(dev, g, c, dq, dk, dv, dout, q, k, v, out, lse, row_dot, pool);
}
void ulysses_attention_backward(Device& dev, Communicator& g, const RingAttentionConfig& c, float* dq, float* dk,
                                float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                const bf16* out, const float* lse, const float* row_dot, ThreadPool* pool) {
  if (c.precision != Precision::bf16) throw InvalidArgument("Ulysses attention runs in f32 but was given bf16 q, k, v");
  backward_as(dev, g, c, dq, dk, dv, dout, q, k, v, out, lse, row_dot, pool);
}

}  // namespace peakbound
