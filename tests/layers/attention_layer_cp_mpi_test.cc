// The attention sublayer under context parallelism (cp = every group size dividing the
// world, groups of consecutive ranks) against the same layer at cp = 1 on the whole
// sequences, in both precisions, with and without gpt-oss's biases, sinks and windows: each rank runs its zigzag shard of each of B sequences
// (ring attention inside), and its y and dx rows must be the cp = 1 layer's at the
// shard's positions, its parameter gradients summed over the group the cp = 1 layer's.
// f32: within 1e-5 of max|ref| (only fp32 summation order differs). bf16: y, dx within
// 1e-2 of max|ref| over the group, every gradient cosine >= 0.999 and norm within 1%: the
// ring folds key blocks in another order than the single-rank kernel, so each P / dS
// tile rounds to bf16 at another running max (up to 2^-9 relative each) and the ring's
// fp32 out / dq / dk / dv narrow once at values that differ in the last fp32 bits, after
// which the usual chain of bf16 roundings follows. The Arena's attention peak of each
// call equals attention_layer_footprint (which merges the ring's) in both precisions.
// The same for Ulysses (schedules/ulysses_attention.h) where cp divides the KV heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/layers/attention_layer_harness.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using attention_test::draw;
using attention_test::Result;
using attention_test::Vec;
using testing::world;

struct Case {
  std::int64_t B, S, H, Hq, Hkv, D;
  bool qk_norm;
  bool gpt_oss = false;     // q/k/v/o biases and sinks
  std::int64_t window = 0;  // sliding window (keys)
  std::int64_t piece = kRingPieceTokens;  // the ring's K/V pieces and the backward's query pieces
};

AttentionLayerConfig config_of(const Case& c, Precision p) {
  AttentionLayerConfig cfg = attention_test::config(c.H, c.Hq, c.Hkv, c.D, c.qk_norm, c.S, p);
  cfg.qkv_bias = cfg.out_bias = cfg.sinks = c.gpt_oss;
  cfg.window = c.window;
  cfg.piece_tokens = c.piece;
  return cfg;
}

// One forward and one backward of this rank's rows `x`, `dy` (B sequences of its shard)
// on group g (null: cp = 1); checks the measured peaks against the footprint.
Result run(const Case& c, Precision p, Communicator* g, const std::vector<Vec>& params, const Vec& x, const Vec& dy,
           bool keep = false, bool output_on_host = false, ContextAttention kind = ContextAttention::ring) {
  AttentionLayerConfig cfg = config_of(c, p);
  cfg.context_attention = kind;
  cfg.output_on_host = output_on_host;
  if (g == nullptr) cfg.piece_tokens = 0;  // the reference: one call over whole sequences
  cfg.cp = g ? g->size() : 1;
  cfg.cp_rank = g ? g->rank() : 0;
  return attention_test::run_layer(cfg, params, x, dy, g, 1, keep);
}

// The rows of B sequences of S tokens [B S, H] at this rank's zigzag positions.
Vec shard_rows(const Vec& v, const Case& c, const CpShard& sh) {
  Vec out;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < sh.tokens(); ++t) {
      const auto at = v.begin() + (b * c.S + sh.position(t)) * c.H;
      out.insert(out.end(), at, at + c.H);
    }
  return out;
}

double cosine(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

double norm_ratio(const Vec& a, const Vec& b) {
  double aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return std::sqrt(aa / bb);
}

double max_relative(const Vec& got, const Vec& ref) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    err = std::max(err, std::abs(double(got[i]) - ref[i])), scale = std::max(scale, std::abs(double(ref[i])));
  return err / scale;
}

std::vector<Case> cases(int cp, ContextAttention kind) {
  if (kind == ContextAttention::ulysses)  // KV heads a multiple of cp: one or two a rank
    return {Case{2, 37, 40, 2 * cp, cp, 16, true}, Case{1, 2 * cp + 1, 24, 4 * cp, 2 * cp, 8, false},
            Case{1, 601, 32, 2 * cp, 2 * cp, 16, true}, Case{2, 37, 24, 2 * cp, cp, 8, false, true, 5},
            Case{1, 301, 32, 2 * cp, cp, 16, false, true, 64, 19}, Case{2, 37, 40, 2 * cp, 2 * cp, 16, true, false, 0, 3},
            Case{1, 601, 32, 2 * cp, cp, 16, true, false, 0, 50},
            // one KV head shared by the group (replicated), with pieces and gpt-oss's sinks
            Case{2, 37, 40, 2 * cp, 1, 16, true}, Case{1, 301, 32, 2 * cp, 1, 16, false, true, 64, 19}};
  // The last three: gpt-oss's attention (biases, sinks) with windows that end inside a
  // zigzag chunk, span several, or cover the whole sequence.
  return {Case{2, 37, 40, 4, 2, 16, true}, Case{1, 2 * cp + 1, 24, 6, 1, 8, false},
          Case{1, 601, 32, 4, 2, 16, true}, Case{2, 37, 24, 4, 2, 8, false, true, 5},
          Case{1, 301, 32, 4, 2, 16, false, true, 64}, Case{1, 23, 24, 4, 4, 8, false, true, 0},
          // K/V and the backward's queries in pieces (attention_query_pieces): as many as the
          // shortest chunk allows, uneven parts, with qk_norm, biases, sinks and windows.
          Case{2, 37, 40, 4, 2, 16, true, false, 0, 3}, Case{1, 301, 32, 4, 2, 16, false, true, 64, 19},
          Case{1, 601, 32, 4, 2, 16, true, false, 0, 50}, Case{2, 37, 24, 4, 2, 8, false, true, 5, 4}};
}

void run_group(Communicator& g, Precision p, ContextAttention kind) {
  const int cp = g.size();
  const bool bf = p == Precision::bf16, ring = kind == ContextAttention::ring;
  double worst = 0, worst_cos = 1;
  for (const Case& c : cases(cp, kind)) {
    SCOPED_TRACE("cp=" + std::to_string(cp) + " " + context_attention_name(kind) + " " +
                 std::string(precision_name(p)) + " B=" + std::to_string(c.B) +
                 " S=" + std::to_string(c.S) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
                 " gpt_oss=" + std::to_string(c.gpt_oss) + " window=" + std::to_string(c.window) +
                 " piece=" + std::to_string(c.piece));
    std::mt19937 rng(static_cast<std::uint32_t>(c.S * 5 + c.H));
    const std::vector<Vec> params = attention_test::draw_params(config_of(c, p), rng);
    const Vec x = draw(c.B * c.S * c.H, rng, 0.0, 1.0), dy = draw(c.B * c.S * c.H, rng, 0.0, 1.0);
    const Result ref = run(c, p, nullptr, params, x, dy);
    const CpShard sh = zigzag_shard(c.S, cp, g.rank());
    Result got = run(c, p, &g, params, shard_rows(x, c, sh), shard_rows(dy, c, sh), false, false, kind);
    // forward_for_backward: the same bits, and the backward sends only its own ring (the
    // recomputing backward's traffic less one forward's): the ring's forward ran once.
    const Result kept = run(c, p, &g, params, shard_rows(x, c, sh), shard_rows(dy, c, sh), true, false, kind);
    EXPECT_EQ(kept.y, got.y);
    EXPECT_EQ(kept.dx, got.dx);
    EXPECT_EQ(kept.grads, got.grads);
    if (ring) {
      EXPECT_GT(got.forward_ring_bytes, 0u);
      EXPECT_EQ(kept.forward_ring_bytes, got.forward_ring_bytes);
      EXPECT_EQ(kept.backward_ring_bytes, got.backward_ring_bytes - got.forward_ring_bytes);
    } else {
      EXPECT_EQ(got.forward_ring_bytes, 0u) << "Ulysses sends nothing round the ring";
    }
    // o on the host (the trainer's one-slot ring): the same bits, recomputing or not.
    for (bool keep : {false, true}) {
      const Result host = run(c, p, &g, params, shard_rows(x, c, sh), shard_rows(dy, c, sh), keep, true, kind);
      EXPECT_EQ(host.y, got.y);
      EXPECT_EQ(host.dx, got.dx);
      EXPECT_EQ(host.grads, got.grads);
    }
    const Vec ref_y = shard_rows(ref.y, c, sh), ref_dx = shard_rows(ref.dx, c, sh);
    const auto n = static_cast<std::int64_t>(ref_y.size());
    for (auto [gv, rv, name] : {std::tuple{&got.y, &ref_y, "y"}, std::tuple{&got.dx, &ref_dx, "dx"}}) {
      const double e = verify::group_relative_error(g, gv->data(), rv->data(), n);
      EXPECT_LE(e, bf ? 1e-2 : 1e-5) << name;
      worst = std::max(worst, e);
    }
    for (std::size_t i = 0; i < got.grads.size(); ++i) {
      Vec& gr = got.grads[i];
      g.all_reduce(gr.data(), gr.size(), DType::f32, ReduceOp::sum);
      if (bf) {
        const double cs = cosine(gr, ref.grads[i]);
        EXPECT_GE(cs, 0.999) << "gradient " << i;
        EXPECT_LE(std::abs(norm_ratio(gr, ref.grads[i]) - 1), 1e-2) << "gradient " << i;
        worst_cos = std::min(worst_cos, cs);
      } else {
        EXPECT_LE(max_relative(gr, ref.grads[i]), 1e-5) << "gradient " << i;
      }
    }
  }
  if (world().rank() == 0)
    std::printf("attention layer cp=%d %s %s vs cp=1: worst y/dx %.3g of max|ref|, worst summed dW cosine %.6f\n", cp,
                context_attention_name(kind), std::string(precision_name(p)).c_str(), worst, worst_cos);
}

TEST(AttentionLayerCp, MatchesTheSingleRankLayerInBothPrecisions) {
  Communicator& w = world();
  for (int cp = 1; cp <= w.size(); ++cp) {
    if (w.size() % cp != 0) continue;
    std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
    ASSERT_EQ(g->size(), cp);
    if (cp == 1) continue;  // the cp = 1 layer is the reference
    for (Precision p : {Precision::f32, Precision::bf16}) run_group(*g, p, ContextAttention::ring);
  }
}

// Ulysses (AttentionLayerConfig::context_attention) in the same layer: the same checks
// against cp = 1 (its bf16 keys in the single-rank kernel's order, so closer than the
// ring's), the measured peaks equal to the footprint that merges Ulysses' buffers.
TEST(AttentionLayerCp, UlyssesMatchesTheSingleRankLayerInBothPrecisions) {
  Communicator& w = world();
  for (int cp = 2; cp <= w.size(); ++cp) {
    if (w.size() % cp != 0) continue;
    std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
    ASSERT_EQ(g->size(), cp);
    for (Precision p : {Precision::f32, Precision::bf16}) run_group(*g, p, ContextAttention::ulysses);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
