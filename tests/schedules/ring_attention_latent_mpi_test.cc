// Ring attention's compressed form (schedules/ring_attention.h, "MLA's compressed form") at
// every CP dividing the world (groups of consecutive ranks; at CP 1 nothing travels and the
// keys go in the call's pieces), in f32 and bf16, at odd
// shapes (shards that differ in length, a head count and widths that divide nothing, nope
// 0): the latent c and the rotated rope key kr travel instead of every head's K and V.
// The reference is the K/V form on the same group with K and V expanded from the same
// latent (mla_expand_kv on each rank's shard): out, lse and dq must equal it, and dc, dkr
// and dWkvb (summed over the group: each rank adds its share) must equal the K/V form's dK,
// dV contracted in double on the host (d kv W, the heads' rope columns summed, d kv^T c
// summed over the group). f32 within 1e-5 of max|ref|, bf16 within 1e-2 (the compressed
// form narrows each hop's partial d kv to bf16 before its GEMMs; the K/V form narrows the
// finished one). The Arena's attention peak of each call equals ring_attention_footprint,
// nothing stays live, and the bytes each call sends (RingAttentionStats::bytes_sent, counted
// by the ring as it posts) equal ring_attention_traffic in both forms, the compressed
// fewer under CP > 1. And the tiles a windowed ring computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/schedules/ring_attention_test_rows.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::shard_rows;
using testing::upload;
using testing::world;

struct Case {
  std::int64_t S, heads, latent, nope, rope, v;
};

std::vector<Case> cases(int cp) {
  return {{2 * cp + 1, 3, 5, 4, 2, 3},  // shards of 2 and 3 tokens
          {37, 2, 7, 0, 4, 5},          // no nope columns: the keys are the rope key alone
          {301, 3, 12, 6, 4, 5}};       // chunks over two query pieces at CP 2
}

std::vector<float> random(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <class T>
std::vector<T> as(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}
template <>
std::vector<bf16> as<bf16>(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
float wide(float x) { return x; }
float wide(bf16 x) { return to_f32(x); }

Buffer zeros(Device& dev, std::int64_t n) { return upload(dev, std::vector<float>(static_cast<std::size_t>(n), 0.0f)); }

std::uint64_t peak(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::attention)];
}

// One form's results on a rank: out, lse, dq, then dk, dv or dc, dkr, and dWkvb (compressed form).
struct Result {
  Buffer out, lse, dq, d0, d1, dw;
  std::uint64_t bytes_fwd = 0, bytes_bwd = 0;
};

// One case on group g in precision A, both forms carrying pieces of piece_tokens
// (RingAttentionConfig::piece_tokens; 0: whole shards); returns the worst relative error.
template <class A>
double run_case(Communicator& g, const Case& c, std::int64_t piece_tokens) {
  const int cp = g.size();
  constexpr Precision prec = std::is_same_v<A, float> ? Precision::f32 : Precision::bf16;
  const std::int64_t H = c.heads, L = c.latent, dn = c.nope, dr = c.rope, dv = c.v, qk = dn + dr;
  const std::int64_t kvw = H * (dn + dv), S = c.S;
  SCOPED_TRACE("CP=" + std::to_string(cp) + " S=" + std::to_string(S) + " H=" + std::to_string(H) + " L=" +
               std::to_string(L) + " nope=" + std::to_string(dn) + " rope=" + std::to_string(dr) + " v=" +
               std::to_string(dv) + (prec == Precision::bf16 ? " bf16" : " f32") + " piece_tokens=" +
               std::to_string(piece_tokens));
  const std::uint64_t seed = static_cast<std::uint64_t>(S * 7 + L);
  // The whole sequence's tensors (the same on every rank), narrowed to A.
  const std::vector<A> c_all = as<A>(random(static_cast<std::size_t>(S * L), seed, 1.0f));
  const std::vector<A> kr_all = as<A>(random(static_cast<std::size_t>(S * dr), seed + 1, 1.0f));
  const std::vector<A> q_all = as<A>(random(static_cast<std::size_t>(S * H * qk), seed + 2, 0.7f));
  const std::vector<A> dout_all = as<A>(random(static_cast<std::size_t>(S * H * dv), seed + 3, 1.0f));
  const std::vector<A> w = as<A>(random(static_cast<std::size_t>(kvw * L), seed + 4, 1.0f / std::sqrt(float(L))));

  RingAttentionConfig kvc;
  kvc.dims.q_heads = kvc.dims.kv_heads = H;
  kvc.dims.qk_dim = qk;
  kvc.dims.v_dim = dv;
  kvc.dims.block_q = 16;
  kvc.dims.block_k = 8;
  kvc.seq_len = S;
  kvc.precision = prec;
  kvc.piece_tokens = piece_tokens;
  RingAttentionConfig lat = kvc;
  lat.latent = L;
  lat.rope = dr;

  const CpShard sh = zigzag_shard(S, cp, g.rank());
  const std::int64_t T = sh.tokens();
  CpuDevice dev(64ull << 20);
  Stream& s = dev.compute_stream();
  Buffer bc = upload(dev, shard_rows(c_all, L, sh)), bkr = upload(dev, shard_rows(kr_all, dr, sh)),
         bq = upload(dev, shard_rows(q_all, H * qk, sh)), bd = upload(dev, shard_rows(dout_all, H * dv, sh)),
         bw = upload(dev, w);
  // The K/V form's K and V, expanded from this rank's latent.
  Buffer bk = upload(dev, std::vector<A>(static_cast<std::size_t>(T * H * qk))),
         bv = upload(dev, std::vector<A>(static_cast<std::size_t>(T * H * dv))),
         bkv = upload(dev, std::vector<A>(static_cast<std::size_t>(T * kvw)));
  Buffer tile = zeros(dev, static_cast<std::int64_t>(linear_tile_spec(T, kvw, prec, Component::layer).bytes / 4 + 1));
  mla_expand_kv(dev, s, T, H, L, dn, dr, dv, bc.as<A>(), bkr.as<A>(), bw.as<A>(), bk.as<A>(), bv.as<A>(), bkv.as<A>(),
                tile.as<float>());

  // Forward then backward of one form; out narrowed once for the backward (the layer's way).
  const auto run = [&](bool latent) {
    const RingAttentionConfig& cfg = latent ? lat : kvc;
    Result r{zeros(dev, T * H * dv), zeros(dev, T * H), zeros(dev, T * H * qk),
             zeros(dev, T * (latent ? L : H * qk)), zeros(dev, T * (latent ? dr : H * dv)), zeros(dev, kvw * L)};
    Buffer out_a = upload(dev, std::vector<A>(static_cast<std::size_t>(T * H * dv)));
    const Footprint fp = ring_attention_footprint(cfg, cp);
    RingAttentionStats fs, bs;
    dev.synchronize();
    dev.arena().reset_peaks();
    if (latent)
      ring_attention_latent_forward(dev, g, cfg, r.out.as<float>(), r.lse.as<float>(), bq.as<A>(), bc.as<A>(),
                                    bkr.as<A>(), bw.as<A>(), nullptr, &fs);
    else
      ring_attention_forward(dev, g, cfg, r.out.as<float>(), r.lse.as<float>(), bq.as<A>(), bk.as<A>(), bv.as<A>(),
                             nullptr, &fs);
    EXPECT_EQ(dev.arena().peak(Component::attention), peak(fp, "forward")) << (latent ? "latent" : "kv");
    if constexpr (std::is_same_v<A, float>)
      std::copy_n(r.out.as<float>(), T * H * dv, out_a.as<float>());
    else
      ops::convert(dev, s, out_a.as<bf16>(), r.out.as<float>(), T * H * dv);
    dev.synchronize();
    dev.arena().reset_peaks();
    if (latent)
      ring_attention_latent_backward(dev, g, cfg, r.dq.as<float>(), r.d0.as<float>(), r.d1.as<float>(),
                                     r.dw.as<float>(), bd.as<A>(), bq.as<A>(), bc.as<A>(), bkr.as<A>(), bw.as<A>(),
                                     out_a.as<A>(), r.lse.as<float>(), nullptr, nullptr, &bs);
    else
      ring_attention_backward(dev, g, cfg, r.dq.as<float>(), r.d0.as<float>(), r.d1.as<float>(), bd.as<A>(),
                              bq.as<A>(), bk.as<A>(), bv.as<A>(), out_a.as<A>(), r.lse.as<float>(), nullptr, nullptr, &bs);
    EXPECT_EQ(dev.arena().peak(Component::attention), peak(fp, "backward")) << (latent ? "latent" : "kv");
    EXPECT_EQ(dev.arena().live(Component::attention), 0u);
    dev.synchronize();
    const RingAttentionTraffic t = ring_attention_traffic(cfg, cp, g.rank());
    EXPECT_EQ(fs.bytes_sent, t.forward) << (latent ? "latent" : "kv");
    EXPECT_EQ(bs.bytes_sent, t.backward) << (latent ? "latent" : "kv");
    r.bytes_fwd = fs.bytes_sent;
    r.bytes_bwd = bs.bytes_sent;
    // given_row_dot: the caller's rowsum(dout * out) in place of out (null), the ring
    // holding no row_dot of its own: the same gradients bit for bit.
    RingAttentionConfig given = cfg;
    given.given_row_dot = true;
    AttentionDims rdd = cfg.dims;
    rdd.tokens = T;
    Buffer rd = zeros(dev, T * H), gq = zeros(dev, T * H * qk), g0 = zeros(dev, T * (latent ? L : H * qk)),
           g1 = zeros(dev, T * (latent ? dr : H * dv)), gw = zeros(dev, kvw * L);
    ops::attention_row_dot(dev, s, rd.as<float>(), bd.as<A>(), out_a.as<A>(), rdd);
    dev.synchronize();
    dev.arena().reset_peaks();
    if (latent)
      ring_attention_latent_backward(dev, g, given, gq.as<float>(), g0.as<float>(), g1.as<float>(), gw.as<float>(),
                                     bd.as<A>(), bq.as<A>(), bc.as<A>(), bkr.as<A>(), bw.as<A>(), nullptr,
                                     r.lse.as<float>(), rd.as<float>());
    else
      ring_attention_backward(dev, g, given, gq.as<float>(), g0.as<float>(), g1.as<float>(), bd.as<A>(), bq.as<A>(),
                              bk.as<A>(), bv.as<A>(), nullptr, r.lse.as<float>(), rd.as<float>());
    EXPECT_EQ(dev.arena().peak(Component::attention), peak(ring_attention_footprint(given, cp), "backward"));
    EXPECT_LT(peak(ring_attention_footprint(given, cp), "backward"), peak(fp, "backward"));
    dev.synchronize();
    const auto same = [](const Buffer& a, const Buffer& b, std::int64_t n) {
      return std::equal(a.as<float>(), a.as<float>() + n, b.as<float>());
    };
    EXPECT_TRUE(same(gq, r.dq, T * H * qk)) << (latent ? "latent" : "kv");
    EXPECT_TRUE(same(g0, r.d0, T * (latent ? L : H * qk)) && same(g1, r.d1, T * (latent ? dr : H * dv)) &&
                same(gw, r.dw, kvw * L))
        << (latent ? "latent" : "kv");
    // A row_dot without given_row_dot is refused (before anything moves).
    if (!latent) {
      EXPECT_THROW(ring_attention_backward(dev, g, cfg, gq.as<float>(), g0.as<float>(), g1.as<float>(), bd.as<A>(),
                                           bq.as<A>(), bk.as<A>(), bv.as<A>(), out_a.as<A>(), r.lse.as<float>(),
                                           rd.as<float>()),
                   InvalidArgument);
    }
    return r;
  };
  Result kv = run(false), la = run(true);
  if (cp > 1) {
    EXPECT_LT(la.bytes_fwd, kv.bytes_fwd);
    EXPECT_LT(la.bytes_bwd, kv.bytes_bwd);
  }

  // The K/V form's dK, dV contracted in double: dc = d kv W, dkr = sum over heads, dW = d kv^T c.
  std::vector<float> dc_ref(static_cast<std::size_t>(T * L)), dkr_ref(static_cast<std::size_t>(T * dr)),
      dw_ref(static_cast<std::size_t>(kvw * L), 0.0f);
  const float *dk = kv.d0.as<float>(), *dvv = kv.d1.as<float>();
  const A* cl = bc.as<A>();
  std::vector<double> dkv(static_cast<std::size_t>(kvw));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t j = 0; j < dn; ++j) dkv[h * (dn + dv) + j] = dk[(t * H + h) * qk + j];
      for (std::int64_t j = 0; j < dv; ++j) dkv[h * (dn + dv) + dn + j] = dvv[(t * H + h) * dv + j];
    }
    for (std::int64_t l = 0; l < L; ++l) {
      double acc = 0;
      for (std::int64_t j = 0; j < kvw; ++j) acc += dkv[j] * wide(w[j * L + l]);
      dc_ref[t * L + l] = static_cast<float>(acc);
    }
    for (std::int64_t r = 0; r < dr; ++r) {
      double acc = 0;
      for (std::int64_t h = 0; h < H; ++h) acc += dk[(t * H + h) * qk + dn + r];
      dkr_ref[t * dr + r] = static_cast<float>(acc);
    }
    for (std::int64_t j = 0; j < kvw; ++j)
      for (std::int64_t l = 0; l < L; ++l) dw_ref[j * L + l] += static_cast<float>(dkv[j] * wide(cl[t * L + l]));
  }
  g.all_reduce(dw_ref.data(), dw_ref.size(), DType::f32, ReduceOp::sum);
  g.all_reduce(la.dw.as<float>(), static_cast<std::size_t>(kvw * L), DType::f32, ReduceOp::sum);

  const double bound = prec == Precision::f32 ? 1e-5 : 1e-2;
  double worst = 0;
  const auto check = [&](const char* what, const float* got, const float* ref, std::int64_t n) {
    const double e = verify::group_relative_error(g, got, ref, n);
    EXPECT_LE(e, bound) << what;
    worst = std::max(worst, e);
  };
  check("out", la.out.as<float>(), kv.out.as<float>(), T * H * dv);
  check("lse", la.lse.as<float>(), kv.lse.as<float>(), T * H);
  check("dq", la.dq.as<float>(), kv.dq.as<float>(), T * H * qk);
  check("dc", la.d0.as<float>(), dc_ref.data(), T * L);
  check("dkr", la.d1.as<float>(), dkr_ref.data(), T * dr);
  check("dWkvb", la.dw.as<float>(), dw_ref.data(), kvw * L);
  return worst;
}

// CP 1 too: nothing travels, the keys go in the call's pieces (each expanded from the
// latent and contracted at once), against the single-rank kernel on the whole K and V.
TEST(RingAttentionLatent, EqualsTheKvFormInEveryGroupSizeAndPrecision) {
  Communicator& w = world();
  for (int cp = 1; cp <= w.size(); ++cp) {
    if (w.size() % cp != 0) continue;
    std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
    ASSERT_EQ(g->size(), cp);
    double f32 = 0, b16 = 0;
    for (const Case& c : cases(cp))
      // Whole shards, and pieces of a third of the widest shard (three passes, parts of
      // unequal length).
      for (std::int64_t pt : {std::int64_t{0}, (zigzag_widest_tokens(c.S, cp) + 2) / 3}) {
        f32 = std::max(f32, run_case<float>(*g, c, pt));
        b16 = std::max(b16, run_case<bf16>(*g, c, pt));
      }
    if (w.rank() == 0)
      std::printf("latent ring attention CP=%d (world %d): worst relative error vs the K/V form f32 %.3g, bf16 %.3g\n",
                  cp, w.size(), f32, b16);
  }
}

// DeepSeek-V3's attention (128 heads, qk 128 + 64, v 128, latent 512) at 1M tokens over 64
// ranks: the bytes one rank sends per layer call, both forms.
TEST(RingAttentionLatent, TrafficOfDeepSeekV3AtOneMillionTokens) {
  RingAttentionConfig c;
  c.dims.q_heads = c.dims.kv_heads = 128;
  c.dims.qk_dim = 192;
  c.dims.v_dim = 128;
  c.seq_len = 1 << 20;
  c.precision = Precision::bf16;
  const RingAttentionTraffic kv = ring_attention_traffic(c, 64, 0);
  c.latent = 512;
  c.rope = 64;
  const RingAttentionTraffic lat = ring_attention_traffic(c, 64, 0);
  // Per token: 128 x (192 + 128) = 40960 elements against 512 + 64 = 576 (71.1x fewer);
  // 63 carried hops of 16384 tokens at 2 bytes, 64 accumulated hops at 4 bytes.
  EXPECT_EQ(kv.forward, 63ull * 16384 * 40960 * 2);
  EXPECT_EQ(lat.forward, 63ull * 16384 * 576 * 2);
  EXPECT_EQ(lat.backward, 63ull * 16384 * 576 * 2 + 64ull * 16384 * 576 * 4);
  EXPECT_EQ(kv.backward * 576, lat.backward * 40960);
}

// The tiles a windowed ring computes (ring_attention_tiles, the loop its calls go through):
// S 256 in [16 x 16] tiles, window 16. Where every chunk starts on a tile edge (CP 2 and 4:
// chunks of 64 and 32 rows) each tile of the sequence lies in exactly one (query chunk, key
// chunk) call, so the group computes exactly the single kernel's 31 tiles (the diagonal 16
// and the 15 below it) of the causal 136; the chunk pairs outside the window are not called.
// Where chunks cut tiles (S 250 at CP 2) a few more are computed, never the causal count.
TEST(RingAttentionTiles, AWindowSkipsTheBlocksOutsideItUnderCp) {
  RingAttentionConfig c;
  c.dims.q_heads = 2;
  c.dims.kv_heads = 1;
  c.dims.qk_dim = c.dims.v_dim = 8;
  c.dims.block_q = c.dims.block_k = 16;
  c.seq_len = 256;
  const auto group = [&](std::int64_t window, int cp) {
    RingAttentionConfig w = c;
    w.dims.window = window;
    AttentionTiles sum;
    for (int r = 0; r < cp; ++r) {
      const AttentionTiles t = ring_attention_tiles(w, cp, r);
      sum.forward += t.forward;
      sum.backward += t.backward;
    }
    return sum;
  };
  for (int cp : {1, 2, 4}) {
    SCOPED_TRACE("CP=" + std::to_string(cp));
    EXPECT_EQ(group(16, cp).forward, 31);
    EXPECT_EQ(group(16, cp).backward, 31);
    EXPECT_EQ(group(0, cp).forward, 136);
    EXPECT_EQ(group(0, cp).backward, 136);
  }
  c.seq_len = 250;
  const AttentionTiles cut = group(16, 2), causal = group(0, 2);
  EXPECT_GE(cut.forward, 31);
  EXPECT_LT(cut.forward, causal.forward / 2);
}

TEST(RingAttentionLatent, RefusesWhatItCannotCarry) {
  RingAttentionConfig c;
  c.dims.q_heads = c.dims.kv_heads = 2;
  c.dims.qk_dim = 6;
  c.dims.v_dim = 4;
  c.seq_len = 8;
  c.latent = 5;
  c.rope = 2;
  const auto message = [&](int cp) {
    try {
      ring_attention_buffers(c, cp);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(1), "accepted");  // nothing travels: the keys a piece at a time
  c.dims.kv_heads = 1;
  EXPECT_EQ(message(2), "ring attention: the compressed (latent) form needs kv_heads == q_heads");
  c.dims.kv_heads = 2;
  c.rope = 7;
  EXPECT_EQ(message(2), "ring attention: rope must be in [1, qk_dim = 6], got 7");
  c.rope = 2;
  EXPECT_EQ(message(2), "accepted");
  CpuDevice dev(1ull << 20);
  std::vector<float> x(256, 0.0f);
  float* f = x.data();
  // The K/V entry points refuse a compressed config, and the reverse.
  EXPECT_THROW(ring_attention_forward(dev, world(), c, f, f, f, f, f), InvalidArgument);
  c.latent = 0;
  EXPECT_THROW(ring_attention_latent_forward(dev, world(), c, f, f, f, f, f, f), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
