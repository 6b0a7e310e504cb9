// Ring attention (schedules/ring_attention.h) at whatever world size the binary runs
// with (1, 2, 3, 4): forward out/lse and backward dq/dk/dv of each rank's zigzag shard
// against (a) the single-rank kernel on the whole sequence and (b) a naive double
// reference, both sliced at the shard's positions, within 1e-5 relative. CP = world
// size, and every smaller CP dividing it as groups of consecutive ranks (CP 1: the
// single-rank path; CP 2 twice at 4 ranks). Lengths that 2 CP does not divide, GQA
// ratios 1, 2, 4, D != Dv, sliding windows, tiles that do not divide the chunks, chunks
// cut into several query pieces (S = 2201), K/V in pieces and the queries in pieces. The
// arena's attention peak during each call equals the footprint's phase exactly, and
// nothing is left allocated. S < 2 CP is an InvalidArgument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/verify/attention_reference.h"
#include "tests/comm/world.h"
#include "tests/schedules/ring_attention_test_rows.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

using Shape = testing::AttentionShape;
std::string name(const Shape& s, int cp) { return testing::shape_name(s, cp); }

std::vector<Shape> shapes(int cp) {
  std::vector<Shape> out;
  int n = 0;
  for (std::int64_t S : {std::int64_t{2} * cp, std::int64_t{2} * cp + 1, std::int64_t{37}, std::int64_t{130}})
    for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}})
      for (std::int64_t W : {0, 5, 40}) {
        const bool odd = (n++ % 2) == 1;
        out.push_back({S, hq, hkv, odd ? 13 : 16, odd ? 8 : 16, W, odd ? 7 : 64, odd ? 5 : 64});
      }
  // Chunks longer than the ring's query pieces (a few hundred rows): several calls per
  // chunk, windows reaching across pieces and chunks.
  out.push_back({2201, 2, 1, 16, 8, 0, 7, 5});
  out.push_back({2201, 4, 2, 8, 8, 300, 64, 64});
  return out;
}

// The naive double reference and the single-rank kernel of a shape's problem (whole
// sequence; the same at every CP), computed once per process: at 4 ranks the world's CP and
// the smaller groups ask for them three times, and the S = 2201 shapes' naive reference is
// most of this file's time (under ASan, 77 of the 115 s the 4-rank mpi tests took).
const std::pair<AttentionResult, AttentionResult>& references(const Shape& s, const AttentionProblem& p) {
  static std::map<std::string, std::pair<AttentionResult, AttentionResult>> cache;
  const std::string key = name(s, 0);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, std::pair{naive_attention(p), kernel_attention(p)}).first;
  return it->second;
}

// Runs every shape on group g (CP = g.size()); returns the worst error vs naive.
double run_shapes(Communicator& g) {
  const int cp = g.size();
  double worst = 0, worst_kernel = 0;
  for (const Shape& s : shapes(cp)) {
    SCOPED_TRACE(name(s, cp));
    const AttentionDims a = s.dims();
    const AttentionProblem p = make_attention_problem(a, 1000 + static_cast<std::uint64_t>(s.S * 7 + s.hq + s.window));
    const auto& [naive, kernel] = references(s, p);
    // Whole shards, and pieces of a third of the widest shard (three passes round the
    // ring, parts of unequal length; fewer where a chunk is shorter than three tokens).
    // Then the queries in three pieces too (RingAttentionConfig::query_pieces; fewer where
    // a chunk is shorter): each piece's call moves the whole K/V, dk and dv summed.
    const int qp = cp > 1 ? static_cast<int>(std::min<std::int64_t>(3, zigzag_shortest_chunk(s.S, cp))) : 1;
    for (auto [pt, pieces] : {std::pair{std::int64_t{0}, 1}, std::pair{(zigzag_widest_tokens(s.S, cp) + 2) / 3, 1},
                              std::pair{(zigzag_widest_tokens(s.S, cp) + 2) / 3, qp}}) {
      SCOPED_TRACE("piece_tokens=" + std::to_string(pt) + " query_pieces=" + std::to_string(pieces));
      CpuDevice dev(64ull << 20);
      const RingAttentionCheck c =
          verify_ring_attention(dev, g, p, naive, kernel, Component::layer, nullptr, pt, pieces);
      RingAttentionConfig cfg;
      cfg.dims = a;
      cfg.seq_len = s.S;
      cfg.piece_tokens = pt;
      testing::expect_exact_and_footprint(c, ring_attention_footprint(cfg, cp), dev);
      worst = std::max(worst, c.worst_naive());
      worst_kernel = std::max(worst_kernel, c.worst_kernel());
    }
  }
  if (world().rank() == 0)
    std::printf("ring attention CP=%d (world %d): %zu shapes, worst relative error vs naive %.3g, vs kernel %.3g\n", cp,
                world().size(), shapes(cp).size(), worst, worst_kernel);
  return worst;
}

TEST(RingAttention, MatchesKernelAndNaiveAtCpEqualToTheWorld) { run_shapes(world()); }

TEST(RingAttention, MatchesInSmallerGroupsOfConsecutiveRanks) {
  Communicator& w = world();
  for (int cp = 1; cp < w.size(); ++cp) {
    if (w.size() % cp != 0) continue;
    std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
    ASSERT_EQ(g->size(), cp);
    run_shapes(*g);
  }
}

// The kernel's shares on a pool (dims.threads workspace slots): same answers.
TEST(RingAttention, KernelSharesOnAThreadPool) {
  Communicator& g = world();
  ThreadPool pool(3);
  for (std::int64_t W : {0, 70}) {
    AttentionDims a;
    a.tokens = 301;
    a.q_heads = 8;
    a.kv_heads = 2;
    a.qk_dim = 16;
    a.v_dim = 12;
    a.window = W;
    a.block_q = 16;
    a.block_k = 24;
    a.threads = 3;
    const AttentionProblem p = make_attention_problem(a, 77);
    const AttentionResult naive = naive_attention(p), kernel = kernel_attention(p, &pool);
    CpuDevice dev(64ull << 20);
    const RingAttentionCheck c = verify_ring_attention(dev, g, p, naive, kernel, Component::layer, &pool);
    EXPECT_LT(c.worst_naive(), 1e-5) << "W=" << W;
    EXPECT_LT(c.worst_kernel(), 1e-5) << "W=" << W;
    RingAttentionConfig cfg;
    cfg.dims = a;
    cfg.seq_len = a.tokens;
    EXPECT_EQ(c.backward_peak, ring_attention_footprint(cfg, g.size()).phase("backward").device[static_cast<std::size_t>(Component::attention)]);
  }
}

TEST(RingAttention, FootprintShrinksWithCp) {
  RingAttentionConfig c;
  c.dims.q_heads = 8;
  c.dims.kv_heads = 2;
  c.dims.qk_dim = c.dims.v_dim = 64;
  c.seq_len = 4096;
  // The ring buffers scale with the shard; CP 1 holds only the kernel's workspace.
  const auto at = [&](int cp) { return ring_attention_footprint(c, cp).phase("backward").device[static_cast<std::size_t>(Component::attention)]; };
  EXPECT_GT(at(2), at(4));
  EXPECT_GT(at(4), at(8));
  EXPECT_EQ(ring_attention_buffers(c, 1).kv_ring.bytes, 0u);
}

// Pieces (RingAttentionConfig::piece_tokens): the passes are ceil(widest shard / piece),
// at most the shortest chunk's tokens; the travelling buffers (kv_ring, dkv_ring) hold the
// widest piece instead of the widest shard, the kernel's workspaces stay.
TEST(RingAttention, PiecesBoundTheTravellingBuffers) {
  RingAttentionConfig c;
  c.dims.q_heads = 8;
  c.dims.kv_heads = 2;
  c.dims.qk_dim = c.dims.v_dim = 64;
  c.seq_len = 65536 + 5;  // cp 4: chunks of 8192 and 8193 tokens, shards of 16384..16386
  const int cp = 4;
  const std::int64_t widest = zigzag_widest_tokens(c.seq_len, cp);
  EXPECT_EQ(ring_attention_pieces(c, cp), 1);
  c.piece_tokens = widest;
  EXPECT_EQ(ring_attention_pieces(c, cp), 1);
  c.piece_tokens = widest - 1;
  EXPECT_EQ(ring_attention_pieces(c, cp), 2);
  c.piece_tokens = 2048;
  EXPECT_EQ(ring_attention_pieces(c, cp), 9);  // ceil(16386 / 2048)
  c.piece_tokens = 1;
  EXPECT_EQ(ring_attention_pieces(c, cp), 8192);  // the shortest chunk
  EXPECT_EQ(ring_attention_pieces(c, 1), 1);
  c.piece_tokens = -1;
  EXPECT_THROW(ring_attention_pieces(c, cp), InvalidArgument);

  c.piece_tokens = 0;
  const RingAttentionBuffers whole = ring_attention_buffers(c, cp);
  c.piece_tokens = 4096;  // 5 passes: parts of 1638..1639 tokens a chunk, pieces of at most 3278
  ASSERT_EQ(ring_attention_pieces(c, cp), 5);
  const RingAttentionBuffers pieces = ring_attention_buffers(c, cp);
  const std::uint64_t lane_bytes = 2 * 64 * 2 * sizeof(float);  // K and V of 2 heads x 64, f32, a token
  EXPECT_EQ(whole.kv_ring.bytes, 2 * static_cast<std::uint64_t>(widest) * lane_bytes);
  EXPECT_EQ(pieces.kv_ring.bytes, 2 * 3278 * lane_bytes);
  EXPECT_EQ(pieces.dkv_ring.bytes, 3 * 3278 * lane_bytes);
  EXPECT_EQ(pieces.workspace_backward.bytes, whole.workspace_backward.bytes);
}

TEST(RingAttention, SequenceShorterThanTwoCpIsInvalidArgument) {
  Communicator& w = world();
  const int cp = w.size();
  RingAttentionConfig c;
  c.dims.q_heads = 2;
  c.dims.kv_heads = 1;
  c.dims.qk_dim = c.dims.v_dim = 4;
  c.seq_len = 2 * cp - 1;
  EXPECT_THROW(check_ring_attention(c, cp), InvalidArgument);
  EXPECT_THROW(ring_attention_buffers(c, cp), InvalidArgument);
  CpuDevice dev(1ull << 20);
  std::vector<float> x(64 * 8, 0.0f);
  // Refused on every rank before anything moves.
  EXPECT_THROW(ring_attention_forward(dev, w, c, x.data(), x.data(), x.data(), x.data(), x.data()), InvalidArgument);
  c.seq_len = 2 * cp;
  EXPECT_NO_THROW(check_ring_attention(c, cp));
  EXPECT_THROW(check_ring_attention(c, 0), InvalidArgument);
  c.dims.kv_heads = 3;
  EXPECT_THROW(check_ring_attention(c, cp), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
