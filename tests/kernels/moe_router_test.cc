// The MoE router (kernels/cpu/moe_router.h, layers/moe_router.h) against a naive double
// reference written from transformers' code: the forward (probs, ids, weights, aux
// loss) and the backward through explicit Jacobians (d logits, dW_gate, dx), then a
// finite-difference check of loss = sum(c * weights) + coef * aux. Odd shapes, both
// norm_topk_prob settings, K from 1 to E. Ties (and near-ties a float rounding could
// flip) are excluded by rejecting seeds; one test pins the documented tie rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/moe_router.h"
#include "peakbound/layers/moe_router.h"
#include "peakbound/ops/moe_router.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using Vec = std::vector<double>;

std::vector<float> randn(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double rel(const std::vector<float>& got, const Vec& want) {
  std::vector<float> w(want.begin(), want.end());
  return cpu::relative_error(got.data(), w.data(), static_cast<std::int64_t>(w.size()));
}

// The router's forward in double, step by step as the transformers code reads.
struct Forward {
  Vec logits, probs, weights;  // [T, E], [T, E], [T, K]
  std::vector<std::int32_t> ids;  // [T, K]
};

Forward forward_ref(const Vec& x, const Vec& w, std::int64_t T, std::int64_t H, std::int64_t E, std::int64_t K,
                    bool norm) {
  Forward f;
  f.logits.assign(T * E, 0.0);
  f.probs.assign(T * E, 0.0);
  f.weights.assign(T * K, 0.0);
  f.ids.assign(T * K, 0);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t j = 0; j < H; ++j) f.logits[t * E + e] += x[t * H + j] * w[e * H + j];
    double mx = -1e300, sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) mx = std::max(mx, f.logits[t * E + e]);
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(f.logits[t * E + e] - mx);
    for (std::int64_t e = 0; e < E; ++e) f.probs[t * E + e] = std::exp(f.logits[t * E + e] - mx) / sum;
    std::vector<std::int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int32_t a, std::int32_t b) { return f.probs[t * E + a] > f.probs[t * E + b]; });
    double s = 0.0;
    for (std::int64_t k = 0; k < K; ++k) s += f.probs[t * E + order[k]];
    for (std::int64_t k = 0; k < K; ++k) {
      f.ids[t * K + k] = order[k];
      f.weights[t * K + k] = f.probs[t * E + order[k]] / (norm ? s : 1.0);
    }
  }
  return f;
}

// transformers' load_balancing_loss_func, literally, over the rows of several layers
// concatenated (probs rows [N, E], ids rows [N, K]):
//   tokens_per_expert[k, e] = mean_n one_hot(ids[n, k])[e]
//   router_prob_per_expert[e] = mean_n probs[n, e]
//   loss = E * sum_{k, e} tokens_per_expert[k, e] * router_prob_per_expert[e]
double hf_aux(const Vec& probs, const std::vector<std::int32_t>& ids, std::int64_t N, std::int64_t E,
              std::int64_t K) {
  Vec tpe(K * E, 0.0), rppe(E, 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t k = 0; k < K; ++k) tpe[k * E + ids[n * K + k]] += 1.0 / N;
    for (std::int64_t e = 0; e < E; ++e) rppe[e] += probs[n * E + e] / N;
  }
  double overall = 0.0;
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t e = 0; e < E; ++e) overall += tpe[k * E + e] * rppe[e];
  return overall * E;
}

// Backward in double through explicit Jacobians, one token at a time:
//   J_w[k, j] = d w_k / d p_{ids j}   (identity without renormalization;
//               (delta_kj - w_k) / S with it, S = sum of the selected probs)
//   J_p[e, f] = d p_e / d logit_f = p_e (delta_ef - p_f)
//   aux: d (coef aux) / d p[n, e] = coef * E / N^2 * counts_e  (counts piecewise constant)
struct Backward {
  Vec dlogits, dw, dx;
};

Backward backward_ref(const Forward& f, const Vec& x, const Vec& w, const Vec& dweights, const Vec& aux_dp,
                      std::int64_t T, std::int64_t H, std::int64_t E, std::int64_t K, bool norm) {
  Backward b;
  b.dlogits.assign(T * E, 0.0);
  b.dw.assign(E * H, 0.0);
  b.dx.assign(T * H, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    double S = 0.0;
    for (std::int64_t k = 0; k < K; ++k) S += f.probs[t * E + f.ids[t * K + k]];
    Vec dp(aux_dp);  // d loss / d p_e
    for (std::int64_t j = 0; j < K; ++j) {
      double g = 0.0;  // sum_k dweights_k J_w[k, j]
      for (std::int64_t k = 0; k < K; ++k) {
        const double wk = f.probs[t * E + f.ids[t * K + k]] / S;
        const double jw = norm ? ((k == j ? 1.0 : 0.0) - wk) / S : (k == j ? 1.0 : 0.0);
        g += dweights[t * K + k] * jw;
      }
      dp[f.ids[t * K + j]] += g;
    }
    for (std::int64_t fi = 0; fi < E; ++fi) {
      double g = 0.0;
      for (std::int64_t e = 0; e < E; ++e)
        g += dp[e] * f.probs[t * E + e] * ((e == fi ? 1.0 : 0.0) - f.probs[t * E + fi]);
      b.dlogits[t * E + fi] = g;
    }
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t j = 0; j < H; ++j) {
        b.dw[e * H + j] += b.dlogits[t * E + e] * x[t * H + j];
        b.dx[t * H + j] += b.dlogits[t * E + e] * w[e * H + j];
      }
  }
  return b;
}

// Smallest gap between adjacent sorted logits among a row's K + 1 largest (all of them
// when K = E): the boundary and order the top-k depends on.
double min_gap(const Forward& f, std::int64_t T, std::int64_t E, std::int64_t K) {
  double gap = 1e300;
  for (std::int64_t t = 0; t < T; ++t) {
    Vec row(f.logits.begin() + t * E, f.logits.begin() + (t + 1) * E);
    std::sort(row.begin(), row.end(), std::greater<>());
    for (std::int64_t k = 0; k < std::min(K, E - 1); ++k) gap = std::min(gap, row[k] - row[k + 1]);
  }
  return gap;
}

struct Case {
  std::int64_t T, H, E, K;
  bool norm;
  std::vector<float> x, w;  // f32 inputs
  Vec xd, wd;               // the same values in double
  Forward ref;
};

// Random x [T, H], W [E, H] whose double logits have no near-tie that matters.
Case make_case(std::int64_t T, std::int64_t H, std::int64_t E, std::int64_t K, bool norm) {
  for (std::uint32_t seed = 1; seed < 1000; ++seed) {
    std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(T * 131 + E * 17 + K));
    Case c{T, H, E, K, norm, randn(T * H, rng), randn(E * H, rng), {}, {}, {}};
    c.xd.assign(c.x.begin(), c.x.end());
    c.wd.assign(c.w.begin(), c.w.end());
    c.ref = forward_ref(c.xd, c.wd, T, H, E, K, norm);
    if (min_gap(c.ref, T, E, K) > 1e-4) return c;
  }
  ADD_FAILURE() << "no tie-free case found";
  return {};
}

void check_case(std::int64_t T, std::int64_t E, std::int64_t K, bool norm) {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " E=" << E << " K=" << K << " norm=" << norm);
  constexpr std::int64_t H = 7;
  const float coef = 0.37f;
  Case c = make_case(T, H, E, K, norm);
  CpuDevice dev(64 << 20);
  Stream& s = dev.compute_stream();
  const MoeRouterShape shape{T, H, E, K, norm};

  // Forward: probs, ids, weights; stats added into pre-filled accumulators.
  std::vector<float> probs(T * E), weights(T * K), counts(E, 2.0f), prob_sums(E, 0.5f);
  std::vector<std::int32_t> ids(T * K, -1);
  moe_router_forward(dev, s, shape, c.x.data(), c.w.data(), probs.data(), ids.data(), weights.data(), counts.data(),
                     prob_sums.data());
  EXPECT_LT(rel(probs, c.ref.probs), 1e-5);
  EXPECT_EQ(ids, c.ref.ids);
  EXPECT_LT(rel(weights, c.ref.weights), 1e-5);
  Vec want_counts(E, 2.0), want_sums(E, 0.5);
  for (std::int64_t i = 0; i < T * K; ++i) want_counts[c.ref.ids[i]] += 1.0;
  for (std::int64_t i = 0; i < T * E; ++i) want_sums[i % E] += c.ref.probs[i];
  EXPECT_LT(rel(counts, want_counts), 1e-7);
  EXPECT_LT(rel(prob_sums, want_sums), 1e-5);

  // The aux loss of this one layer (N = T) against transformers' formula, and its gradient.
  std::fill(counts.begin(), counts.end(), 0.0f);
  std::fill(prob_sums.begin(), prob_sums.end(), 0.0f);
  cpu::moe_router_stats(counts.data(), prob_sums.data(), probs.data(), ids.data(), T, E, K);
  std::vector<float> loss(1), aux_grad(E);
  ops::moe_aux_loss(dev, s, loss.data(), aux_grad.data(), counts.data(), prob_sums.data(), E, T, coef);
  EXPECT_LT(rel(loss, {hf_aux(c.ref.probs, c.ref.ids, T, E, K)}), 1e-5);
  Vec aux_dp(E, 0.0);
  for (std::int64_t i = 0; i < T * K; ++i) aux_dp[c.ref.ids[i]] += double(coef) * E / (double(T) * T);
  EXPECT_LT(rel(aux_grad, aux_dp), 1e-6);

  // Backward: dW added into a pre-filled gradient, dx written, then added into.
  std::mt19937 rng(99);
  const std::vector<float> dweights = randn(T * K, rng), dw0 = randn(E * H, rng), dx0 = randn(T * H, rng);
  const Vec dwd(dweights.begin(), dweights.end());
  const Backward b = backward_ref(c.ref, c.xd, c.wd, dwd, aux_dp, T, H, E, K, norm);
  std::vector<float> dlogits(T * E);
  cpu::moe_router_backward(dlogits.data(), dweights.data(), probs.data(), ids.data(), aux_grad.data(), T, E, K, norm);
  EXPECT_LT(rel(dlogits, b.dlogits), 1e-5);
  std::vector<float> dw = dw0, dx(T * H, 123.0f);
  std::vector<float> p2 = probs;
  moe_router_backward(dev, s, shape, c.x.data(), c.w.data(), dweights.data(), p2.data(), ids.data(), aux_grad.data(),
                      dw.data(), dx.data(), false);
  EXPECT_LT(rel(p2, b.dlogits), 1e-5);  // probs now hold dlogits
  Vec want_dw(b.dw);
  for (std::int64_t i = 0; i < E * H; ++i) want_dw[i] += dw0[i];
  EXPECT_LT(rel(dw, want_dw), 1e-5);
  EXPECT_LT(rel(dx, b.dx), 1e-5);  // written: the 123s are gone
  std::vector<float> dx_acc = dx0;
  p2 = probs;
  moe_router_backward(dev, s, shape, c.x.data(), c.w.data(), dweights.data(), p2.data(), ids.data(), aux_grad.data(),
                      dw.data(), dx_acc.data(), true);
  Vec want_dx(b.dx);
  for (std::int64_t i = 0; i < T * H; ++i) want_dx[i] += dx0[i];
  EXPECT_LT(rel(dx_acc, want_dx), 1e-5);

  // dx may alias x.
  std::vector<float> x_alias = c.x, dw_scratch(E * H, 0.0f);
  p2 = probs;
  moe_router_backward(dev, s, shape, x_alias.data(), c.w.data(), dweights.data(), p2.data(), ids.data(),
                      aux_grad.data(), dw_scratch.data(), x_alias.data(), false);
  EXPECT_LT(rel(x_alias, b.dx), 1e-5);
  EXPECT_LT(rel(dw_scratch, b.dw), 1e-5);

  // Without the aux term.
  const Backward b0 = backward_ref(c.ref, c.xd, c.wd, dwd, Vec(E, 0.0), T, H, E, K, norm);
  cpu::moe_router_backward(dlogits.data(), dweights.data(), probs.data(), ids.data(), nullptr, T, E, K, norm);
  EXPECT_LT(rel(dlogits, b0.dlogits), 1e-5);
}

TEST(MoeRouter, ForwardAndBackwardMatchNaiveDoubleOnOddShapes) {
  for (std::int64_t T : {1, 5, 33})
    for (std::int64_t E : {2, 3, 8, 60})
      for (std::int64_t K : {1, 2, 4, 60}) {
        const std::int64_t k = std::min(K, E);  // 60 stands for K = E
        if (K != 60 && K > E) continue;
        for (bool norm : {true, false}) check_case(T, E, k, norm);
      }
}

// Mixtral's weights (always renormalized) equal a softmax over the selected logits.
TEST(MoeRouter, RenormalizedWeightsAreTheSoftmaxOfTheTopKLogits) {
  Case c = make_case(5, 7, 8, 3, true);
  for (std::int64_t t = 0; t < 5; ++t) {
    double s = 0.0;
    for (std::int64_t k = 0; k < 3; ++k) s += std::exp(c.ref.logits[t * 8 + c.ref.ids[t * 3 + k]]);
    for (std::int64_t k = 0; k < 3; ++k)
      EXPECT_NEAR(c.ref.weights[t * 3 + k], std::exp(c.ref.logits[t * 8 + c.ref.ids[t * 3 + k]]) / s, 1e-12);
  }
}

// The documented tie rule: equal probs go to the lower expert index first.
TEST(MoeRouter, TiesGoToTheLowerExpertIndex) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 2.0f,   // three-way tie on top
                                     0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};  // all equal
  std::vector<float> probs(12), w(8);
  std::vector<std::int32_t> ids(8);
  cpu::moe_router_forward(probs.data(), ids.data(), w.data(), logits.data(), 2, 6, 4, true);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{1, 2, 4, 3, 0, 1, 2, 3}));
  for (int k = 4; k < 8; ++k) EXPECT_FLOAT_EQ(w[k], 0.25f);
  cpu::moe_router_forward(probs.data(), ids.data(), w.data(), logits.data(), 2, 6, 1, false);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
}

// Two layers' statistics summed give transformers' loss over the concatenated rows,
// which is not the sum (nor the mean) of the two per-layer losses.
TEST(MoeRouter, AuxLossOverLayersIsOneLossOverConcatenatedRows) {
  constexpr std::int64_t T = 5, H = 7, E = 8, K = 2;
  // Layer 2 sees other tokens (the first layer's inputs, shifted) and the same gate.
  const Case a = make_case(T, H, E, K, true);
  Case c2 = a;
  for (float& v : c2.x) v = v * 0.5f + 0.25f;
  c2.xd.assign(c2.x.begin(), c2.x.end());
  c2.ref = forward_ref(c2.xd, c2.wd, T, H, E, K, true);
  ASSERT_GT(min_gap(c2.ref, T, E, K), 1e-4);

  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  const MoeRouterShape shape{T, H, E, K, true};
  std::vector<float> counts(E, 0.0f), sums(E, 0.0f), loss(1);
  for (const Case* c : std::vector<const Case*>{&a, &c2}) {
    MoeRouter r(dev, shape);
    r.forward(c->x.data(), c->w.data(), counts.data(), sums.data());
  }
  ops::moe_aux_loss(dev, s, loss.data(), nullptr, counts.data(), sums.data(), E, 2 * T, 1.0f);
  Vec probs(a.ref.probs);
  probs.insert(probs.end(), c2.ref.probs.begin(), c2.ref.probs.end());
  std::vector<std::int32_t> ids(a.ref.ids);
  ids.insert(ids.end(), c2.ref.ids.begin(), c2.ref.ids.end());
  const double want = hf_aux(probs, ids, 2 * T, E, K);
  EXPECT_LT(rel(loss, {want}), 1e-5);
  const double per_layer = hf_aux(a.ref.probs, a.ref.ids, T, E, K) + hf_aux(c2.ref.probs, c2.ref.ids, T, E, K);
  EXPECT_GT(std::abs(want - per_layer / 2), 1e-4) << want << " vs " << per_layer / 2;  // the combination matters
}

// loss = sum(c * weights) + coef * aux, differentiated by central differences in double
// (ids and counts are piecewise constant; no near-tie is within the step).
TEST(MoeRouter, GradientsMatchFiniteDifferences) {
  constexpr std::int64_t T = 3, H = 4, E = 5, K = 2;
  constexpr double coef = 0.7, h = 1e-6;
  for (bool norm : {true, false}) {
    SCOPED_TRACE(norm);
    Case c = make_case(T, H, E, K, norm);
    std::mt19937 rng(17);
    const std::vector<float> cw = randn(T * K, rng);
    auto loss_of = [&](const Vec& x, const Vec& w) {
      const Forward f = forward_ref(x, w, T, H, E, K, norm);
      EXPECT_EQ(f.ids, c.ref.ids);
      double l = 0.0;
      for (std::int64_t i = 0; i < T * K; ++i) l += cw[i] * f.weights[i];
      return l + coef * hf_aux(f.probs, f.ids, T, E, K);
    };
    CpuDevice dev(16 << 20);
    Stream& s = dev.compute_stream();
    const MoeRouterShape shape{T, H, E, K, norm};
    MoeRouter r(dev, shape);
    std::vector<float> counts(E, 0.0f), sums(E, 0.0f), aux_grad(E), dw(E * H, 0.0f), dx(T * H);
    r.forward(c.x.data(), c.w.data(), counts.data(), sums.data());
    ops::moe_aux_loss(dev, s, nullptr, aux_grad.data(), counts.data(), sums.data(), E, T, static_cast<float>(coef));
    std::copy(cw.begin(), cw.end(), r.d_weights());
    r.backward(c.x.data(), c.w.data(), aux_grad.data(), dw.data(), dx.data(), false);
    Vec fd_w(E * H), fd_x(T * H);
    for (std::int64_t i = 0; i < E * H; ++i) {
      Vec wp = c.wd, wm = c.wd;
      wp[i] += h;
      wm[i] -= h;
      fd_w[i] = (loss_of(c.xd, wp) - loss_of(c.xd, wm)) / (2 * h);
    }
    for (std::int64_t i = 0; i < T * H; ++i) {
      Vec xp = c.xd, xm = c.xd;
      xp[i] += h;
      xm[i] -= h;
      fd_x[i] = (loss_of(xp, c.wd) - loss_of(xm, c.wd)) / (2 * h);
    }
    EXPECT_LT(rel(dw, fd_w), 1e-5);
    EXPECT_LT(rel(dx, fd_x), 1e-5);
  }
}

TEST(MoeRouter, ZeroTokensAndBadShapes) {
  CpuDevice dev(1 << 20);
  MoeRouter r(dev, {0, 4, 3, 2, true});
  r.forward(nullptr, nullptr, nullptr, nullptr);
  r.backward(nullptr, nullptr, nullptr, nullptr, nullptr, true);
  EXPECT_THROW(moe_router_buffers({4, 4, 3, 4, true}), InvalidArgument);  // K > E
  EXPECT_THROW(moe_router_buffers({4, 4, 3, 0, true}), InvalidArgument);
  EXPECT_THROW(moe_router_buffers({-1, 4, 3, 1, true}), InvalidArgument);
  EXPECT_THROW(moe_router_buffers({4, 0, 3, 1, true}), InvalidArgument);
  EXPECT_THROW(moe_aux_buffers(0), InvalidArgument);
}

// The router and the aux buffers allocate exactly what moe_router_footprint says.
TEST(MoeRouterFootprint, MeasuredPeakEqualsTheFootprint) {
  for (auto [T, E, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{33, 60, 4}, {1, 3, 3}, {5, 8, 2}}) {
    constexpr std::int64_t H = 7;
    const MoeRouterShape shape{T, H, E, K, true};
    CpuDevice dev(16 << 20);
    std::mt19937 rng(1);
    // The test's own tensors under params, grads and checkpoints: the router's are layer and workspace.
    Buffer x = dev.allocate(Component::checkpoints, T * H * 4), w = dev.allocate(Component::params, E * H * 4);
    Buffer dw = dev.allocate(Component::grads, E * H * 4), dx = dev.allocate(Component::checkpoints, T * H * 4);
    const auto xv = randn(T * H, rng), wv = randn(E * H, rng);
    std::copy(xv.begin(), xv.end(), x.as<float>());
    std::copy(wv.begin(), wv.end(), w.as<float>());
    std::fill(dw.as<float>(), dw.as<float>() + E * H, 0.0f);
    const Footprint f = moe_router_footprint(shape);
    dev.arena().reset_peaks();
    {
      const MoeAuxBuffers ab = moe_aux_buffers(E);
      Buffer counts = dev.allocate(ab.counts.component, ab.counts.bytes);
      Buffer sums = dev.allocate(ab.prob_sums.component, ab.prob_sums.bytes);
      Buffer grad = dev.allocate(ab.aux_grad.component, ab.aux_grad.bytes);
      Buffer loss = dev.allocate(ab.loss.component, ab.loss.bytes);
      std::fill(counts.as<float>(), counts.as<float>() + E, 0.0f);
      std::fill(sums.as<float>(), sums.as<float>() + E, 0.0f);
      MoeRouter r(dev, shape);
      r.forward(x.as<float>(), w.as<float>(), counts.as<float>(), sums.as<float>());
      for (Component c : {Component::layer, Component::workspace})
        EXPECT_EQ(dev.arena().peak(c), f.phase("forward").device[static_cast<std::size_t>(c)]) << component_name(c);
      dev.arena().reset_peaks();
      ops::moe_aux_loss(dev, dev.compute_stream(), loss.as<float>(), grad.as<float>(), counts.as<float>(),
                        sums.as<float>(), E, T, 0.01f);
      std::fill(r.d_weights(), r.d_weights() + T * K, 1.0f);
      r.backward(x.as<float>(), w.as<float>(), grad.as<float>(), dw.as<float>(), dx.as<float>(), false);
      for (Component c : {Component::layer, Component::workspace})
        EXPECT_EQ(dev.arena().peak(c), f.phase("backward").device[static_cast<std::size_t>(c)]) << component_name(c);
      EXPECT_EQ(dev.arena().peak(), dev.arena().live());  // nothing beyond what is held
    }
    EXPECT_EQ(dev.arena().live(Component::layer), 0u);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
