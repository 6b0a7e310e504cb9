// The flash-style causal GQA attention against a naive double-precision softmax
// attention (forward out and lse, backward dq, dk, dv) on odd shapes and odd tiles;
// the backward against finite differences of the kernel's own forward; bitwise
// determinism across runs and thread counts; tiling changes only fp32 rounding. Blocks
// of a longer sequence (Tq != Tk, global offsets, rows that see nothing) and the
// accumulate mode (key blocks folded in any order, gradients added into) against the
// same reference at those positions.
#include "peakbound/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "tests/kernels/attention_naive.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using Vec = std::vector<float>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec random_vec(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string name(const AttentionDims& a) {
  return "T=" + std::to_string(a.tokens) + " Hq=" + std::to_string(a.q_heads) + " Hkv=" + std::to_string(a.kv_heads) +
         " D=" + std::to_string(a.qk_dim) + " Dv=" + std::to_string(a.v_dim) + " W=" + std::to_string(a.window) +
         " Bq=" + std::to_string(a.block_q) + " Bk=" + std::to_string(a.block_k);
}

struct Inputs {
  Vec q, k, v, dout;
};

Inputs make_inputs(const AttentionDims& a, std::mt19937& rng) {
  const auto T = static_cast<std::size_t>(a.tokens), Tk = static_cast<std::size_t>(a.key_tokens());
  // |q|, |k| up to 2: scores of a few units, so the softmax is far from uniform.
  return {random_vec(T * a.q_heads * a.qk_dim, rng, -2.0f, 2.0f), random_vec(Tk * a.kv_heads * a.qk_dim, rng, -2.0f, 2.0f),
          random_vec(Tk * a.kv_heads * a.v_dim, rng, -1.0f, 1.0f), random_vec(T * a.q_heads * a.v_dim, rng, -1.0f, 1.0f)};
}

struct Reference {
  Vec out, lse, dq, dk, dv;
};

// The textbook attention in double (attention_naive.h) at the global positions.
Reference naive(const AttentionDims& a, const Inputs& in) {
  testing::NaiveAttention r = testing::naive_attention(a, in.q, in.k, in.v, in.dout);
  return {std::move(r.out), std::move(r.lse), std::move(r.dq), std::move(r.dk), std::move(r.dv)};
}

// Runs forward then backward with NaN-filled outputs and workspace (so a read of an
// unwritten value shows), and a guard after the workspace that must stay untouched.
Reference run(const AttentionDims& a, const Inputs& in, ThreadPool* pool = nullptr) {
  const std::int64_t T = a.tokens, Tk = a.key_tokens();
  Reference r{Vec(T * a.q_heads * a.v_dim, kNaN), Vec(T * a.q_heads, kNaN), Vec(T * a.q_heads * a.qk_dim, kNaN),
              Vec(Tk * a.kv_heads * a.qk_dim, kNaN), Vec(Tk * a.kv_heads * a.v_dim, kNaN)};
  const std::int64_t guard = 64, fw = attention_forward_workspace_floats(a), bw = attention_backward_workspace_floats(a);
  EXPECT_EQ(attention_workspace_floats(a), std::max(fw, bw));
  Vec ws(std::max(fw, bw) + guard, kNaN);
  for (std::int64_t i = 0; i < guard; ++i) ws[fw + i] = 1234.5f;
  attention_forward(r.out.data(), r.lse.data(), in.q.data(), in.k.data(), in.v.data(), a, ws.data(), pool);
  for (std::int64_t i = 0; i < guard; ++i) EXPECT_EQ(ws[fw + i], 1234.5f) << "forward wrote past its workspace";
  std::fill(ws.begin(), ws.end(), kNaN);
  for (std::int64_t i = 0; i < guard; ++i) ws[bw + i] = 1234.5f;
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                     r.out.data(), r.lse.data(), a, ws.data(), pool);
  for (std::int64_t i = 0; i < guard; ++i) EXPECT_EQ(ws[bw + i], 1234.5f) << "backward wrote past its workspace";
  return r;
}

double rel(const Vec& got, const Vec& want) {
  return relative_error(got.data(), want.data(), static_cast<std::int64_t>(got.size()));
}

// Every field within tol of the reference; returns the worst relative error seen.
double expect_close(const Reference& got, const Reference& want, double tol, const std::string& what) {
  const std::pair<const char*, std::pair<const Vec*, const Vec*>> fields[] = {
      {"out", {&got.out, &want.out}}, {"lse", {&got.lse, &want.lse}}, {"dq", {&got.dq, &want.dq}},
      {"dk", {&got.dk, &want.dk}},    {"dv", {&got.dv, &want.dv}}};
  double worst = 0;
  for (const auto& [field, pair] : fields) {
    const double e = rel(*pair.first, *pair.second);
    EXPECT_LE(e, tol) << field << " " << what;
    worst = std::max(worst, e);
  }
  return worst;
}

TEST(Attention, MatchesNaiveDoubleOnOddShapesAndTiles) {
  std::mt19937 rng(2024);
  double worst = 0;
  std::string worst_case;
  double worst_130 = 0;
  int cases = 0;
  for (std::int64_t T : {1, 2, 7, 65, 130})
    for (auto [hq, hkv] : {std::pair{1, 1}, std::pair{4, 2}, std::pair{6, 3}, std::pair{8, 1}})
      for (auto [d, dv] : {std::pair{8, 8}, std::pair{13, 13}, std::pair{64, 64}, std::pair{13, 24}})
        for (auto [bq, bk] : {std::pair{7, 5}, std::pair{64, 64}}) {
          AttentionDims a;
          a.tokens = T;
          a.q_heads = hq;
          a.kv_heads = hkv;
          a.qk_dim = d;
          a.v_dim = dv;
          a.block_q = bq;
          a.block_k = bk;
          const Inputs in = make_inputs(a, rng);
          const double e = expect_close(run(a, in), naive(a, in), 1e-5, name(a));
          if (e > worst) worst_case = name(a);
          worst = std::max(worst, e);
          if (T == 130) worst_130 = std::max(worst_130, e);
          ++cases;
        }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("attention vs naive double: %d cases, worst relative error %.3g (%s), at T=130 %.3g\n", cases, worst,
              worst_case.c_str(), worst_130);
}

TEST(Attention, SlidingWindowAndExplicitScaleMatchNaive) {
  std::mt19937 rng(7);
  for (std::int64_t W : {1, 3, 16, 200})
    for (auto [bq, bk] : {std::pair{7, 5}, std::pair{64, 64}, std::pair{4, 32}}) {
      AttentionDims a;
      a.tokens = 65;
      a.q_heads = 4;
      a.kv_heads = 2;
      a.qk_dim = 13;
      a.v_dim = 9;
      a.window = W;
      a.scale = 0.3f;
      a.block_q = bq;
      a.block_k = bk;
      const Inputs in = make_inputs(a, rng);
      expect_close(run(a, in), naive(a, in), 1e-5, name(a));
    }
}

TEST(Attention, TilingChangesOnlyRounding) {
  std::mt19937 rng(3);
  AttentionDims a;
  a.tokens = 130;
  a.q_heads = 6;
  a.kv_heads = 3;
  a.qk_dim = 64;
  a.v_dim = 64;
  const Inputs in = make_inputs(a, rng);
  a.block_q = 64;
  a.block_k = 64;
  const Reference base = run(a, in);
  for (auto [bq, bk] : {std::pair{7, 5}, std::pair{1, 1}, std::pair{130, 3}, std::pair{3, 130}, std::pair{200, 200}}) {
    a.block_q = bq;
    a.block_k = bk;
    expect_close(run(a, in), base, 1e-6, name(a));
  }
}

// The score products S = Q K^T and dP = dO V^T run as NN sgemm calls on K and V transposed
// into per-thread tiles (attention.cc, Wide), and as NT calls on K and V in place where a tile
// or head is over 512 (the route before). One 45 x 45 tile either way (a shape at which
// OpenBLAS's NT and NN kernels sum alike, attention.cc, Wide): the same bits, with and
// without a window, head dims that are and are not whole 16-wide blocks of the transpose.
TEST(Attention, ScoreProductsOnTransposedTilesHaveTheSameBits) {
  std::mt19937 rng(29);
  for (std::int64_t window : {0, 9}) {
    AttentionDims a;
    a.tokens = 45, a.q_heads = 4, a.kv_heads = 2, a.qk_dim = 20, a.v_dim = 32, a.window = window;
    const Inputs in = make_inputs(a, rng);
    AttentionDims nn = a, nt = a;
    nn.block_q = nn.block_k = 64;
    nt.block_q = nt.block_k = 600;  // past 512: K and V read in place
    const Reference x = run(nn, in), y = run(nt, in);
    EXPECT_EQ(testing::first_differing_output(x, y), "") << "window " << window;
    expect_close(x, naive(a, in), 1e-5, name(a));
  }
}

TEST(Attention, DeterministicAcrossRunsAndThreadCounts) {
  std::mt19937 rng(5);
  AttentionDims a;
  a.tokens = 130;
  a.q_heads = 8;
  a.kv_heads = 2;
  a.qk_dim = 13;
  a.v_dim = 13;
  a.block_q = 7;
  a.block_k = 5;
  const Inputs in = make_inputs(a, rng);
  const Reference first = run(a, in), second = run(a, in);
  ThreadPool pool(3);
  a.threads = 3;
  const Reference pooled = run(a, in, &pool), pooled2 = run(a, in, &pool);
  for (const Reference* r : {&second, &pooled, &pooled2}) {
    EXPECT_EQ(r->out, first.out);
    EXPECT_EQ(r->lse, first.lse);
    EXPECT_EQ(r->dq, first.dq);
    EXPECT_EQ(r->dk, first.dk);
    EXPECT_EQ(r->dv, first.dv);
  }
}

// loss = sum(dout * out) through the f32 forward, central differences with a large
// step (fp32 rounding of the loss is ~1e-7 of it, so a small step would measure noise).
TEST(Attention, BackwardMatchesFiniteDifferencesOfTheForward) {
  std::mt19937 rng(9);
  AttentionDims a;
  a.tokens = 6;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.qk_dim = 5;
  a.v_dim = 3;
  a.block_q = 4;
  a.block_k = 3;
  Inputs in = make_inputs(a, rng);
  const Reference g = run(a, in);
  Vec ws(attention_workspace_floats(a)), out(in.dout.size()), lse(a.tokens * a.q_heads);
  auto loss = [&] {
    attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), a, ws.data());
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += double(in.dout[i]) * out[i];
    return s;
  };
  const float h = 1e-2f;
  auto fd = [&](Vec& x) {
    Vec grad(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float keep = x[i];
      x[i] = keep + h;
      const double up = loss();
      x[i] = keep - h;
      const double down = loss();
      x[i] = keep;
      grad[i] = static_cast<float>((up - down) / (2.0 * h));
    }
    return grad;
  };
  // Tolerance 2e-4: truncation h^2/6 * f''' ~ 2e-5 and fp32 rounding of the loss
  // (~1e-7 * |loss| / h) ~ 1e-5 relative; measured 2e-5 dq, 2.4e-5 dk, 4e-6 dv.
  const double eq = rel(g.dq, fd(in.q)), ek = rel(g.dk, fd(in.k)), ev = rel(g.dv, fd(in.v));
  std::printf("attention backward vs finite differences: dq %.3g dk %.3g dv %.3g\n", eq, ek, ev);
  EXPECT_LT(eq, 2e-4);
  EXPECT_LT(ek, 2e-4);
  EXPECT_LT(ev, 2e-4);
}

// lse of rows that see no key is -inf in both (checked exactly), then compared as 0.
Reference finite_lse(Reference r, const Reference& want) {
  for (std::size_t x = 0; x < r.lse.size(); ++x) {
    const bool got_inf = r.lse[x] == -std::numeric_limits<float>::infinity();
    const bool want_inf = want.lse[x] == -std::numeric_limits<float>::infinity();
    EXPECT_EQ(got_inf, want_inf) << "lse row " << x;
    if (got_inf && want_inf) r.lse[x] = 0.0f;
  }
  return r;
}
Reference zero_inf_lse(Reference r) {
  for (auto& x : r.lse)
    if (x == -std::numeric_limits<float>::infinity()) x = 0.0f;
  return r;
}

std::string block_name(const AttentionDims& a) {
  return name(a) + " Tk=" + std::to_string(a.key_tokens()) + " qo=" + std::to_string(a.q_offset) +
         " ko=" + std::to_string(a.k_offset);
}

// One call on a block pair: queries at q_offset, keys at k_offset, Tq != Tk, blocks
// before, after, overlapping and beside each other, some rows seeing nothing.
TEST(Attention, BlocksAtGlobalOffsetsMatchNaive) {
  std::mt19937 rng(11);
  int cases = 0;
  struct B {
    std::int64_t tq, tk, qo, ko;
  };
  for (B b : {B{17, 9, 40, 0}, B{9, 17, 30, 25}, B{13, 13, 13, 13}, B{20, 11, 5, 12}, B{7, 30, 0, 3}, B{33, 33, 0, 0},
              B{5, 8, 100, 0}})
    for (std::int64_t W : {0, 4, 23})
      for (auto [bq, bk] : {std::pair{7, 5}, std::pair{64, 64}, std::pair{4, 9}}) {
        AttentionDims a;
        a.tokens = b.tq;
        a.kv_tokens = b.tk;
        a.q_offset = b.qo;
        a.k_offset = b.ko;
        a.q_heads = 4;
        a.kv_heads = 2;
        a.qk_dim = 13;
        a.v_dim = 9;
        a.window = W;
        a.block_q = bq;
        a.block_k = bk;
        const Inputs in = make_inputs(a, rng);
        const Reference want = naive(a, in);
        expect_close(finite_lse(run(a, in), want), zero_inf_lse(want), 1e-5, block_name(a));
        ++cases;
      }
  std::printf("attention blocks at offsets vs naive double: %d cases\n", cases);
}

// A query block of a longer sequence folds the sequence's key chunks one call each, in
// a scrambled order (accumulate); the backward adds each chunk's dq, dk, dv in. The
// result is the whole-sequence attention of those queries.
TEST(Attention, AccumulatedKeyChunksMatchTheWholeSequence) {
  std::mt19937 rng(13);
  const std::int64_t S = 61;
  for (std::int64_t W : {0, 9})
    for (auto [hq, hkv, d, dv] : {std::tuple{4, 2, 13, 9}, std::tuple{4, 4, 8, 8}, std::tuple{8, 2, 16, 5}})
      for (bool given_row_dot : {false, true})
        for (auto [q0, q1] : {std::pair{0, 61}, std::pair{20, 45}, std::pair{50, 61}}) {
          AttentionDims whole;
          whole.tokens = q1 - q0;
          whole.kv_tokens = S;
          whole.q_offset = q0;
          whole.q_heads = hq;
          whole.kv_heads = hkv;
          whole.qk_dim = d;
          whole.v_dim = dv;
          whole.window = W;
          whole.block_q = 6;
          whole.block_k = 5;
          const Inputs in = make_inputs(whole, rng);
          const Reference want = naive(whole, in);
          // Chunks [0, 7) [7, 20) [20, 21) [21, 44) [44, 61), visited out of order.
          const std::vector<std::pair<std::int64_t, std::int64_t>> chunks = {{21, 44}, {0, 7}, {44, 61}, {20, 21}, {7, 20}};
          const std::int64_t T = whole.tokens;
          Reference got{Vec(T * hq * dv, kNaN), Vec(T * hq, -std::numeric_limits<float>::infinity()), Vec(T * hq * d, 0.0f),
                        Vec(S * hkv * d, 0.0f), Vec(S * hkv * dv, 0.0f)};
          AttentionDims a = whole;
          a.accumulate = true;
          Vec ws(attention_workspace_floats(a), kNaN), row_dot(T * hq, kNaN);
          for (auto [c0, c1] : chunks) {
            a.kv_tokens = c1 - c0;
            a.k_offset = c0;
            attention_forward(got.out.data(), got.lse.data(), in.q.data(), in.k.data() + c0 * hkv * d,
                              in.v.data() + c0 * hkv * dv, a, ws.data());
          }
          if (given_row_dot) attention_row_dot(row_dot.data(), in.dout.data(), got.out.data(), a);
          for (auto [c0, c1] : chunks) {
            a.kv_tokens = c1 - c0;
            a.k_offset = c0;
            attention_backward(got.dq.data(), got.dk.data() + c0 * hkv * d, got.dv.data() + c0 * hkv * dv, in.dout.data(),
                               in.q.data(), in.k.data() + c0 * hkv * d, in.v.data() + c0 * hkv * dv, got.out.data(),
                               got.lse.data(), a, ws.data(), nullptr, given_row_dot ? row_dot.data() : nullptr);
          }
          expect_close(got, want, 1e-5,
                       block_name(whole) + (given_row_dot ? " row_dot given" : " row_dot computed"));
        }
}

// A call whose keys all lie after its queries does no work: its keys and values (NaN
// here) are never read, and a running state and added-into gradients stay as they were.
TEST(Attention, AccumulateWithNoVisibleKeyLeavesTheStateAlone) {
  // Keys after every query; keys before every query's window.
  struct B {
    std::int64_t qo, ko, window;
  };
  for (B b : {B{0, 10, 0}, B{20, 0, 4}, B{20, 0, 15}})
    for (auto [bq, bk] : {std::pair{64, 64}, std::pair{3, 4}}) {
      SCOPED_TRACE("qo=" + std::to_string(b.qo) + " ko=" + std::to_string(b.ko) + " W=" + std::to_string(b.window) +
                   " Bq=" + std::to_string(bq) + " Bk=" + std::to_string(bk));
      std::mt19937 rng(17);
      AttentionDims a;
      a.tokens = 10;
      a.kv_tokens = 6;
      a.q_offset = b.qo;
      a.k_offset = b.ko;
      a.window = b.window;
      a.q_heads = 2;
      a.kv_heads = 1;
      a.qk_dim = 4;
      a.v_dim = 3;
      a.block_q = bq;
      a.block_k = bk;
      a.accumulate = true;
      Inputs in = make_inputs(a, rng);
      std::fill(in.k.begin(), in.k.end(), kNaN);
      std::fill(in.v.begin(), in.v.end(), kNaN);
      Vec out = random_vec(10 * 2 * 3, rng, -1, 1), lse = random_vec(10 * 2, rng, -1, 1);
      const Vec out0 = out, lse0 = lse;
      Vec ws(attention_workspace_floats(a), kNaN);
      attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), a, ws.data());
      EXPECT_EQ(out, out0);
      EXPECT_EQ(lse, lse0);
      Vec dq(10 * 2 * 4, 1.0f), dk(6 * 4, 2.0f), dv(6 * 3, 3.0f);
      attention_backward(dq.data(), dk.data(), dv.data(), in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                         out.data(), lse.data(), a, ws.data());
      EXPECT_EQ(dq, Vec(10 * 2 * 4, 1.0f));
      EXPECT_EQ(dk, Vec(6 * 4, 2.0f));
      EXPECT_EQ(dv, Vec(6 * 3, 3.0f));
    }
}

// attention_tiles counts the tiles the kernels' loops visit: exactly the [Bq x Bk] tiles
// that hold at least one visible (query, key) pair, in both passes (nothing outside the
// window or after the queries is computed and masked), at odd tiles, windows and offsets.
TEST(Attention, TilesComputedAreExactlyThoseWithAVisiblePair) {
  for (const auto& [T, Tk, qo, ko, W, Bq, Bk] :
       std::vector<std::tuple<int, int, int, int, int, int, int>>{{37, 0, 0, 0, 0, 8, 8},
                                                                   {37, 0, 0, 0, 5, 8, 8},
                                                                   {100, 0, 0, 0, 16, 7, 13},
                                                                   {64, 0, 0, 0, 64, 16, 16},
                                                                   {50, 0, 0, 0, 200, 9, 4},
                                                                   {30, 45, 60, 10, 20, 6, 11},
                                                                   {30, 20, 10, 40, 0, 8, 8},
                                                                   {33, 17, 200, 0, 64, 5, 3}}) {
    AttentionDims a;
    a.tokens = T;
    a.kv_tokens = Tk;
    a.q_heads = a.kv_heads = 1;
    a.qk_dim = a.v_dim = 4;
    a.q_offset = qo;
    a.k_offset = ko;
    a.window = W;
    a.block_q = Bq;
    a.block_k = Bk;
    std::int64_t want = 0;
    for (std::int64_t i0 = 0; i0 < T; i0 += Bq)
      for (std::int64_t j0 = 0; j0 < a.key_tokens(); j0 += Bk) {
        bool any = false;
        for (std::int64_t i = i0; i < std::min<std::int64_t>(i0 + Bq, T); ++i)
          for (std::int64_t j = j0; j < std::min(j0 + Bk, a.key_tokens()); ++j)
            any = any || (ko + j <= qo + i && (W == 0 || ko + j > qo + i - W));
        want += any ? 1 : 0;
      }
    const AttentionTiles got = attention_tiles(a);
    EXPECT_EQ(got.forward, want) << T << " " << W << " " << Bq << "x" << Bk << " at " << qo << "/" << ko;
    EXPECT_EQ(got.backward, want) << T << " " << W << " " << Bq << "x" << Bk << " at " << qo << "/" << ko;
  }
  // A window of 16 over 1024 tokens at 64 x 64 tiles: 31 of the causal kernel's 528 per pass.
  AttentionDims a;
  a.tokens = 1024;
  a.q_heads = a.kv_heads = 1;
  a.qk_dim = a.v_dim = 4;
  a.block_q = a.block_k = 64;
  a.window = 16;
  EXPECT_EQ(attention_tiles(a).forward, 31);
  a.window = 0;
  EXPECT_EQ(attention_tiles(a).forward, 16 * 17 / 2);
}

TEST(Attention, BadDimsThrowInvalidArgument) {
  AttentionDims a;
  a.tokens = 4;
  a.q_heads = 6;
  a.kv_heads = 4;
  a.qk_dim = 8;
  a.v_dim = 8;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);  // 6 % 4 != 0
  a.kv_heads = 3;
  EXPECT_NO_THROW(check_attention_dims(a));
  a.block_k = 0;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
  a.block_k = 64;
  a.window = -1;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
  a.window = 0;
  a.kv_tokens = -1;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
  a.kv_tokens = 0;
  a.k_offset = -2;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
  a.k_offset = 0;
  a.tokens = 0;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
