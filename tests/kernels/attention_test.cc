// The flash-style causal GQA attention against a naive double-precision softmax
// attention (forward out and lse, backward dq, dk, dv) on odd shapes and odd tiles;
// the backward against finite differences of the kernel's own forward; bitwise
// determinism across runs and thread counts; tiling changes only fp32 rounding.
#include "peakbound/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::cpu {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
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
  const auto T = static_cast<std::size_t>(a.tokens);
  // |q|, |k| up to 2: scores of a few units, so the softmax is far from uniform.
  return {random_vec(T * a.q_heads * a.qk_dim, rng, -2.0f, 2.0f), random_vec(T * a.kv_heads * a.qk_dim, rng, -2.0f, 2.0f),
          random_vec(T * a.kv_heads * a.v_dim, rng, -1.0f, 1.0f), random_vec(T * a.q_heads * a.v_dim, rng, -1.0f, 1.0f)};
}

struct Reference {
  Vec out, lse, dq, dk, dv;
};

// The textbook attention in double: full score rows with the causal (and window) mask,
// a two-pass softmax, then the gradients through P.
Reference naive(const AttentionDims& a, const Inputs& in) {
  const std::int64_t T = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const double scale = a.effective_scale();
  DVec out(T * Hq * Dv, 0.0), lse(T * Hq), dq(T * Hq * D, 0.0), dk(T * Hkv * D, 0.0), dv(T * Hkv * Dv, 0.0);
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t g = h / (Hq / Hkv);
    for (std::int64_t i = 0; i < T; ++i) {
      std::vector<double> s(T, 0.0), p(T, 0.0), dp(T, 0.0);
      double m = -1e300;
      auto vis = [&](std::int64_t j) { return j <= i && (a.window == 0 || j > i - a.window); };
      for (std::int64_t j = 0; j < T; ++j) {
        if (!vis(j)) continue;
        double x = 0;
        for (std::int64_t d = 0; d < D; ++d) x += double(in.q[(i * Hq + h) * D + d]) * in.k[(j * Hkv + g) * D + d];
        s[j] = scale * x;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j < T; ++j)
        if (vis(j)) sum += std::exp(s[j] - m);
      lse[i * Hq + h] = m + std::log(sum);
      double di = 0;
      for (std::int64_t j = 0; j < T; ++j) {
        if (!vis(j)) continue;
        p[j] = std::exp(s[j] - lse[i * Hq + h]);
        for (std::int64_t d = 0; d < Dv; ++d) {
          out[(i * Hq + h) * Dv + d] += p[j] * in.v[(j * Hkv + g) * Dv + d];
          dp[j] += double(in.dout[(i * Hq + h) * Dv + d]) * in.v[(j * Hkv + g) * Dv + d];
          dv[(j * Hkv + g) * Dv + d] += p[j] * in.dout[(i * Hq + h) * Dv + d];
        }
        di += p[j] * dp[j];
      }
      for (std::int64_t j = 0; j < T; ++j) {
        if (!vis(j)) continue;
        const double ds = p[j] * (dp[j] - di) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          dq[(i * Hq + h) * D + d] += ds * in.k[(j * Hkv + g) * D + d];
          dk[(j * Hkv + g) * D + d] += ds * in.q[(i * Hq + h) * D + d];
        }
      }
    }
  }
  auto f = [](const DVec& x) { return Vec(x.begin(), x.end()); };
  return {f(out), f(lse), f(dq), f(dk), f(dv)};
}

// Runs forward then backward with NaN-filled outputs and workspace (so a read of an
// unwritten value shows), and a guard after the workspace that must stay untouched.
Reference run(const AttentionDims& a, const Inputs& in, ThreadPool* pool = nullptr) {
  const std::int64_t T = a.tokens;
  Reference r{Vec(T * a.q_heads * a.v_dim, kNaN), Vec(T * a.q_heads, kNaN), Vec(T * a.q_heads * a.qk_dim, kNaN),
              Vec(T * a.kv_heads * a.qk_dim, kNaN), Vec(T * a.kv_heads * a.v_dim, kNaN)};
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
  a.tokens = 0;
  EXPECT_THROW(check_attention_dims(a), InvalidArgument);
}

}  // namespace
}  // namespace peakbound::cpu
