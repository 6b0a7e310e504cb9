// Ring attention in bf16 (schedules/ring_attention.h, "Mixed precision") at CP = the
// world size and every smaller CP dividing it (groups of consecutive ranks; CP 1 is the
// single-rank path): each rank's shard of bf16 q, k, v, dout through the ring, the fp32 out
// narrowed once (as the attention layer does) and passed back to the backward, against
// the single-rank bf16 kernel on the whole sequence, sliced at the shard's positions.
// Both run the same bf16 math; they differ in the order the key blocks are folded, so the
// running max each P tile is scaled by and rounded at differs (P and dS round to bf16 at
// up to 2^-9 relative each, the fp32 sums reorder): out, lse, dq, dk, dv within 1e-2 of
// max|ref| over the group. The carried K/V lanes are bf16 (kv_ring half the f32 bytes),
// the Arena's attention peak of each call equals the bf16 footprint, nothing stays live,
// and the f32 entry points refuse a bf16 config (and the reverse).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/verify/attention_reference.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/schedules/ring_attention_test_rows.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::narrow;
using testing::shard_rows;
using testing::upload;
using testing::world;

struct Case {
  std::int64_t S, hq, hkv, d, dv, bq, bk;
};

std::string name(const Case& c, int cp) {
  return "CP=" + std::to_string(cp) + " S=" + std::to_string(c.S) + " Hq=" + std::to_string(c.hq) +
         " Hkv=" + std::to_string(c.hkv) + " D=" + std::to_string(c.d) + " Dv=" + std::to_string(c.dv) +
         " Bq=" + std::to_string(c.bq) + " Bk=" + std::to_string(c.bk);
}

std::vector<Case> cases(int cp) {
  return {{2 * cp + 1, 4, 2, 16, 16, 64, 64},
          {37, 4, 1, 16, 8, 7, 5},
          {130, 2, 2, 8, 8, 64, 64},
          {601, 4, 2, 16, 16, 64, 64}};  // shard chunks over several query pieces at CP 2
}

// Every case on group g; returns the worst relative error against the single rank.
double run_cases(Communicator& g) {
  const int cp = g.size();
  double worst = 0;
  for (const Case& c : cases(cp)) {
    SCOPED_TRACE(name(c, cp));
    AttentionDims a;
    a.tokens = c.S;
    a.q_heads = c.hq;
    a.kv_heads = c.hkv;
    a.qk_dim = c.d;
    a.v_dim = c.dv;
    a.block_q = c.bq;
    a.block_k = c.bk;
    const AttentionProblem p = make_attention_problem(a, 500 + static_cast<std::uint64_t>(c.S * 3 + c.hkv));
    const std::vector<bf16> q = narrow(p.q), k = narrow(p.k), v = narrow(p.v), dout = narrow(p.dout);
    const std::vector<std::vector<float>> ref = testing::single_rank_bf16(a, q, k, v, dout);

    // Whole shards, and pieces of a third of the widest shard (three passes).
    for (std::int64_t pt : {std::int64_t{0}, (zigzag_widest_tokens(c.S, cp) + 2) / 3}) {
      SCOPED_TRACE("piece_tokens=" + std::to_string(pt));
      RingAttentionConfig cfg;
      cfg.dims = a;
      cfg.seq_len = c.S;
      cfg.precision = Precision::bf16;
      cfg.piece_tokens = pt;
      RingAttentionConfig f32 = cfg;
      f32.precision = Precision::f32;
      if (cp > 1) {
        EXPECT_EQ(2 * ring_attention_buffers(cfg, cp).kv_ring.bytes, ring_attention_buffers(f32, cp).kv_ring.bytes);
      }
      EXPECT_EQ(ring_attention_buffers(cfg, cp).dkv_ring.bytes, ring_attention_buffers(f32, cp).dkv_ring.bytes);

      const CpShard sh = zigzag_shard(c.S, cp, g.rank());
      const std::int64_t T = sh.tokens(), wq = c.hq * c.d, wk = c.hkv * c.d, wv = c.hkv * c.dv, wo = c.hq * c.dv;
      CpuDevice dev(64ull << 20);
      Buffer bq = upload(dev, shard_rows(q, wq, sh)), bk = upload(dev, shard_rows(k, wk, sh)),
             bv = upload(dev, shard_rows(v, wv, sh)), bd = upload(dev, shard_rows(dout, wo, sh));
      Buffer out = upload(dev, std::vector<float>(static_cast<std::size_t>(T * wo))),
             lse = upload(dev, std::vector<float>(static_cast<std::size_t>(T * c.hq))),
             dq = upload(dev, std::vector<float>(static_cast<std::size_t>(T * wq))),
             dk = upload(dev, std::vector<float>(static_cast<std::size_t>(T * wk))),
             dv = upload(dev, std::vector<float>(static_cast<std::size_t>(T * wv))),
             out16 = upload(dev, std::vector<bf16>(static_cast<std::size_t>(T * wo)));
      const Footprint fp = ring_attention_footprint(cfg, cp);
      dev.arena().reset_peaks();
      ring_attention_forward(dev, g, cfg, out.as<float>(), lse.as<float>(), bq.as<bf16>(), bk.as<bf16>(), bv.as<bf16>());
      EXPECT_EQ(dev.arena().peak(Component::attention), fp.phase("forward").device[static_cast<std::size_t>(Component::attention)]);
      ops::convert(dev, dev.compute_stream(), out16.as<bf16>(), out.as<float>(), T * wo);
      dev.arena().reset_peaks();
      ring_attention_backward(dev, g, cfg, dq.as<float>(), dk.as<float>(), dv.as<float>(), bd.as<bf16>(), bq.as<bf16>(),
                              bk.as<bf16>(), bv.as<bf16>(), out16.as<bf16>(), lse.as<float>(), nullptr);
      EXPECT_EQ(dev.arena().peak(Component::attention), fp.phase("backward").device[static_cast<std::size_t>(Component::attention)]);
      EXPECT_EQ(dev.arena().live(Component::attention), 0u);
      dev.synchronize();
      const Buffer* got[5] = {&out, &lse, &dq, &dk, &dv};
      const std::int64_t widths[5] = {wo, c.hq, wq, wk, wv};
      const char* const names[5] = {"out", "lse", "dq", "dk", "dv"};
      for (int f = 0; f < 5; ++f) {
        const std::vector<float> r = shard_rows(ref[static_cast<std::size_t>(f)], widths[f], sh);
        const double e = verify::group_relative_error(g, got[f]->as<float>(), r.data(), T * widths[f]);
        EXPECT_LE(e, 1e-2) << names[f];
        worst = std::max(worst, e);
      }
    }
  }
  if (world().rank() == 0)
    std::printf("bf16 ring attention CP=%d (world %d): worst relative error vs the single-rank bf16 kernel %.3g\n", cp,
                world().size(), worst);
  return worst;
}

TEST(RingAttentionBf16, MatchesTheSingleRankBf16KernelInEveryGroupSize) {
  testing::each_group([](Communicator& g) { run_cases(g); });
}

TEST(RingAttentionBf16, EntryPointsRefuseTheOtherPrecision) {
  Communicator& w = world();
  RingAttentionConfig c;
  c.dims.q_heads = 2;
  c.dims.kv_heads = 1;
  c.dims.qk_dim = c.dims.v_dim = 4;
  c.seq_len = 2 * w.size();
  CpuDevice dev(1ull << 20);
  std::vector<float> x(64 * 8, 0.0f);
  std::vector<bf16> h(64 * 8);
  c.precision = Precision::bf16;  // refused on every rank before anything moves
  try {
    ring_attention_forward(dev, w, c, x.data(), x.data(), x.data(), x.data(), x.data());
    ADD_FAILURE() << "a bf16 ring attention ran f32 q, k, v";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "ring attention runs in bf16 but was given f32 q, k, v");
  }
  float* f = x.data();
  EXPECT_THROW(ring_attention_backward(dev, w, c, f, f, f, f, f, f, f, f, f, nullptr), InvalidArgument);
  c.precision = Precision::f32;
  EXPECT_THROW(ring_attention_forward(dev, w, c, x.data(), x.data(), h.data(), h.data(), h.data()), InvalidArgument);
  const bf16* b = h.data();
  EXPECT_THROW(ring_attention_backward(dev, w, c, f, f, f, b, b, b, b, b, f, nullptr), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
