// Ulysses attention (schedules/ulysses_attention.h) at whatever world size the binary runs
// with (1-4), at CP = the world size and every smaller CP dividing it (groups of consecutive
// ranks): forward out/lse and backward dq/dk/dv of each rank's zigzag shard against the
// single-rank kernel on the whole sequence and a naive double reference, within 1e-5
// relative (the ring's harness, verify_ring_attention, with kind ulysses). Lengths 2 CP
// does not divide, GQA ratios 1 and 2, one and two KV heads a rank (one and two head
// steps), D != Dv, windows, odd tiles, the queries in three pieces (dk, dv summed over the
// calls), S = 2201 (at the world's cp, against the kernel only); cp 1 only at one rank. bf16 against the single-rank bf16 kernel to 1e-2 of max|ref| (the
// ring's bound). The arena's attention peak of every call equals the footprint's phase,
// the bytes a rank sends equal ulysses_attention_traffic, nothing stays live; heads cp cannot
// split are refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ulysses_attention.h"
#include "peakbound/verify/attention_reference.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/schedules/ring_attention_test_rows.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::each_group;
using testing::narrow;
using testing::shard_rows;
using testing::upload;
using testing::world;

using Shape = testing::AttentionShape;
std::string name(const Shape& s, int cp) { return testing::shape_name(s, cp); }

// KV heads a multiple of cp: one head a rank (GQA 1 and 2) and two (two head steps); and
// one KV head shared by every rank (replicated: Hq / cp query heads each, dK/dV summed),
// and Hq 4 over Hkv 2 where cp allows it (cp 4: each KV head on two ranks).
std::vector<Shape> shapes(int cp) {
  std::vector<Shape> out;
  int n = 0;
  for (std::int64_t S : {std::int64_t{2} * cp, std::int64_t{2} * cp + 1, std::int64_t{37}, std::int64_t{130}})
    for (auto [hq, hkv] : {std::pair{cp, cp}, std::pair{2 * cp, cp}, std::pair{4 * cp, 2 * cp}, std::pair{2 * cp, 1},
                           std::pair{4, 2}})
      if (ulysses_refusal(hq, hkv, cp).empty()) {
        // Odd and even shapes alternate: D 13 / Dv 8 with 7 x 5 tiles, or 16 / 16 with 64 x 64;
        // every third one with a window of 5 keys.
        const bool odd = (n % 2) == 1;
        const std::int64_t W = n++ % 3 == 2 ? 5 : 0;
        out.push_back({S, hq, hkv, odd ? 13 : 16, odd ? 8 : 16, W, odd ? 7 : 64, odd ? 5 : 64});
      }
  if (cp != world().size()) return out;  // the long shapes once: at the world's cp
  out.push_back({2201, 2 * cp, cp, 16, 8, 0, 7, 5});
  out.push_back({2201, 2 * cp, 2 * cp, 8, 8, 300, 64, 64});
  out.push_back({2201, 2 * cp, 1, 16, 8, 40, 64, 64});
  return out;
}

double run_shapes(Communicator& g) {
  const int cp = g.size();
  double worst = 0, worst_kernel = 0;
  for (const Shape& s : shapes(cp)) {
    SCOPED_TRACE(name(s, cp));
    const AttentionDims a = s.dims();
    const AttentionProblem p = make_attention_problem(a, 3000 + static_cast<std::uint64_t>(s.S * 7 + s.hq + s.window));
    // S = 2201: against the kernel only (its naive reference, O(S^2) in double for every
    // group's heads, was most of this file's time; the kernel is checked against it in
    // the kernel's and the ring's tests).
    const AttentionResult kernel = kernel_attention(p), naive = s.S > 1000 ? kernel : naive_attention(p);
    const int qp = static_cast<int>(std::min<std::int64_t>(3, zigzag_shortest_chunk(s.S, cp)));
    for (int pieces : {1, qp}) {
      SCOPED_TRACE("query_pieces=" + std::to_string(pieces));
      CpuDevice dev(64ull << 20);
      const std::uint64_t sent = ulysses_attention_bytes_sent();
      const RingAttentionCheck c = verify_ring_attention(dev, g, p, naive, kernel, Component::layer, nullptr, 0,
                                                         pieces, ContextAttention::ulysses);
      if (pieces == 1) {  // one forward and one backward: what the traffic function counts
        RingAttentionConfig one;
        one.dims = a;
        one.seq_len = s.S;
        const RingAttentionTraffic t = ulysses_attention_traffic(one, cp, g.rank());
        EXPECT_EQ(ulysses_attention_bytes_sent() - sent, t.forward + t.backward);
      }
      RingAttentionConfig cfg;
      cfg.dims = a;
      cfg.seq_len = s.S;
      cfg.query_pieces = pieces;
      testing::expect_exact_and_footprint(c, ulysses_attention_footprint(cfg, cp), dev);
      worst = std::max(worst, c.worst_naive());
      worst_kernel = std::max(worst_kernel, c.worst_kernel());
    }
  }
  if (world().rank() == 0)
    std::printf("Ulysses attention CP=%d (world %d): %zu shapes, worst relative error vs naive %.3g, vs kernel %.3g\n",
                cp, world().size(), shapes(cp).size(), worst, worst_kernel);
  return worst;
}

TEST(UlyssesAttention, MatchesKernelAndNaiveInEveryGroupSize) {
  // cp >= 2 (the layer calls Ulysses only there); cp 1 where the world is one rank.
  each_group([](Communicator& g) { run_shapes(g); }, world().size() > 1 ? 2 : 1);
}

// bf16: the single-rank bf16 kernel's five results on the whole sequence, against each
// rank's shard through Ulysses (the fp32 out narrowed once and given back to the backward).
TEST(UlyssesAttention, Bf16MatchesTheSingleRankBf16Kernel) {
  each_group([](Communicator& g) {
    const int cp = g.size();
    double worst = 0;
    for (const Shape& c : {Shape{2 * cp + 1, 4 * cp, 2 * cp, 16, 16, 0, 64, 64}, Shape{37, 2 * cp, cp, 16, 8, 5, 7, 5},
                           Shape{601, 2 * cp, cp, 16, 16, 0, 64, 64}, Shape{37, 2 * cp, 1, 16, 8, 0, 64, 64}}) {
      SCOPED_TRACE(name(c, cp));
      const AttentionDims a = c.dims();
      const AttentionProblem p = make_attention_problem(a, 700 + static_cast<std::uint64_t>(c.S));
      const std::vector<bf16> q = narrow(p.q), k = narrow(p.k), v = narrow(p.v), dout = narrow(p.dout);
      const std::int64_t wq = c.hq * c.d, wk = c.hkv * c.d, wv = c.hkv * c.dv, wo = c.hq * c.dv;
      const std::vector<std::vector<float>> ref = testing::single_rank_bf16(a, q, k, v, dout);
      RingAttentionConfig cfg;
      cfg.dims = a;
      cfg.seq_len = c.S;
      cfg.precision = Precision::bf16;
      const CpShard sh = zigzag_shard(c.S, cp, g.rank());
      const std::int64_t T = sh.tokens();
      CpuDevice dev(64ull << 20);
      Buffer bq = upload(dev, shard_rows(q, wq, sh)), bk = upload(dev, shard_rows(k, wk, sh)),
             bv = upload(dev, shard_rows(v, wv, sh)), bd = upload(dev, shard_rows(dout, wo, sh));
      const auto zeros = [&](std::int64_t w) { return upload(dev, std::vector<float>(static_cast<std::size_t>(T * w))); };
      Buffer out = zeros(wo), lse = zeros(c.hq), dq = zeros(wq), dk = zeros(wk), dv = zeros(wv),
             out16 = upload(dev, std::vector<bf16>(static_cast<std::size_t>(T * wo)));
      const Footprint fp = ulysses_attention_footprint(cfg, cp);
      dev.arena().reset_peaks();
      ulysses_attention_forward(dev, g, cfg, out.as<float>(), lse.as<float>(), bq.as<bf16>(), bk.as<bf16>(),
                                bv.as<bf16>());
      EXPECT_EQ(dev.arena().peak(Component::attention),
                fp.phase("forward").device[static_cast<std::size_t>(Component::attention)]);
      ops::convert(dev, dev.compute_stream(), out16.as<bf16>(), out.as<float>(), T * wo);
      dev.arena().reset_peaks();
      ulysses_attention_backward(dev, g, cfg, dq.as<float>(), dk.as<float>(), dv.as<float>(), bd.as<bf16>(),
                                 bq.as<bf16>(), bk.as<bf16>(), bv.as<bf16>(), out16.as<bf16>(), lse.as<float>(), nullptr);
      EXPECT_EQ(dev.arena().peak(Component::attention),
                fp.phase("backward").device[static_cast<std::size_t>(Component::attention)]);
      EXPECT_EQ(dev.arena().live(Component::attention), 0u);
      dev.synchronize();
      const Buffer* got[5] = {&out, &lse, &dq, &dk, &dv};
      const std::int64_t widths[5] = {wo, c.hq, wq, wk, wv};
      for (int f = 0; f < 5; ++f) {
        const std::vector<float> r = shard_rows(ref[static_cast<std::size_t>(f)], widths[f], sh);
        const double e = verify::group_relative_error(g, got[f]->as<float>(), r.data(), T * widths[f]);
        EXPECT_LE(e, 1e-2) << kAttentionFields[f];
        worst = std::max(worst, e);
      }
    }
    if (world().rank() == 0)
      std::printf("bf16 Ulysses attention CP=%d (world %d): worst relative error vs the single-rank bf16 kernel %.3g\n",
                  cp, world().size(), worst);
  });
}

TEST(UlyssesAttention, HeadsTheGroupCannotSplitAreRefused) {
  RingAttentionConfig c;
  c.dims.q_heads = 6;
  c.dims.kv_heads = 3;
  c.dims.qk_dim = c.dims.v_dim = 8;
  c.seq_len = 64;
  try {
    check_ulysses_attention(c, 2);
    ADD_FAILURE() << "3 KV heads over 2 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "Ulysses attention splits the heads over the 2 context-parallel ranks: cp must divide the 3 KV heads, "
              "or be a multiple of them that divides the 6 query heads");
  }
  EXPECT_NO_THROW(check_ulysses_attention(c, 3));  // one KV head a rank
  EXPECT_NO_THROW(check_ulysses_attention(c, 6));  // each KV head on two ranks, one query head each
  c.latent = 16;
  EXPECT_THROW(check_ulysses_attention(c, 3), InvalidArgument);
  EXPECT_EQ(ulysses_refusal(32, 8, 4), "");
  EXPECT_EQ(ulysses_refusal(32, 4, 8), "");   // replicated
  EXPECT_NE(ulysses_refusal(6, 2, 4), "");    // 2 KV heads divide 4 ranks, but 4 does not divide 6 query heads
  EXPECT_NE(ulysses_refusal(64, 4, 6), "");   // neither divides
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
