// DeepSeek-V3's sigmoid group-limited router (kernels/cpu/moe_router_sigmoid.h):
//  - against transformers' own DeepseekV3TopkRouter (tests/fixtures/hf/deepseek_v3_router,
//    scripts/hf_reference/make_router_fixture.py): the same experts for every token, the
//    weights and d logits to f32 rounding, grouped (n_group 4 of 16 experts, 2 kept,
//    renormalized, scaled 2.5) and one group (Kimi-K2's form, not renormalized);
//  - against a naive double reference at odd shapes, its backward by central differences;
//  - the documented tie rule, the bias steering the choice but not the weight, the
//    auxiliary-loss-free update, and shapes that do not fit as one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/moe_router_sigmoid.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using cpu::SigmoidRouting;

struct Routed {
  std::vector<float> scores, weights;
  std::vector<std::int32_t> ids;
};

Routed route(const std::vector<float>& logits, const std::vector<float>& bias, std::int64_t T, std::int64_t E,
             std::int64_t K, const SigmoidRouting& r) {
  Routed o{std::vector<float>(logits.size()), std::vector<float>(static_cast<std::size_t>(T * K)),
           std::vector<std::int32_t>(static_cast<std::size_t>(T * K))};
  cpu::moe_router_sigmoid_forward(o.scores.data(), o.ids.data(), o.weights.data(), logits.data(),
                                  bias.empty() ? nullptr : bias.data(), T, E, K, r);
  return o;
}

TEST(MoeRouterSigmoid, TransformersDeepseekV3RouterSameExpertsWeightsAndGradients) {
  const SafeTensorsFile f = SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) +
                                                  "/tests/fixtures/hf/deepseek_v3_router/router.safetensors");
  struct Case {
    std::string name;
    std::int64_t E, K;
    SigmoidRouting r;
  };
  for (const Case& c : {Case{"grouped", 16, 3, {4, 2, true, 2.5f}}, Case{"one_group", 12, 4, {1, 1, false, 1.0f}}}) {
    SCOPED_TRACE(c.name);
    const std::vector<float> logits = f.read_f32(c.name + ".logits"), bias = f.read_f32(c.name + ".bias");
    const std::vector<float> weights = f.read_f32(c.name + ".weights"), dweights = f.read_f32(c.name + ".dweights");
    const std::vector<float> dlogits = f.read_f32(c.name + ".dlogits");
    const std::vector<std::int64_t> ids = f.read_i64(c.name + ".ids");
    const std::int64_t T = static_cast<std::int64_t>(logits.size()) / c.E, K = c.K;
    ASSERT_EQ(static_cast<std::int64_t>(ids.size()), T * K);
    const Routed o = route(logits, bias, T, c.E, K, c.r);
    // transformers returns each token's experts unsorted: compare by expert id, and carry
    // its upstream gradient into our slot order.
    std::vector<float> dw(static_cast<std::size_t>(T * K)), want_w(dw.size());
    std::size_t mismatched = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      std::map<std::int64_t, std::size_t> theirs;
      for (std::int64_t k = 0; k < K; ++k) theirs[ids[static_cast<std::size_t>(t * K + k)]] = static_cast<std::size_t>(t * K + k);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::size_t i = static_cast<std::size_t>(t * K + k);
        const auto it = theirs.find(o.ids[i]);
        if (it == theirs.end()) {
          ++mismatched;
          continue;
        }
        dw[i] = dweights[it->second];
        want_w[i] = weights[it->second];
      }
    }
    ASSERT_EQ(mismatched, 0u) << "tokens routed to other experts than transformers'";
    EXPECT_LT(cpu::relative_error(o.weights.data(), want_w.data(), T * K), 1e-6);
    std::vector<float> d(static_cast<std::size_t>(T * c.E));
    cpu::moe_router_sigmoid_backward(d.data(), dw.data(), o.scores.data(), o.ids.data(), T, c.E, K, c.r);
    EXPECT_LT(cpu::relative_error(d.data(), dlogits.data(), T * c.E), 1e-5);
  }
}

// The reference in double, as the transformers code reads (full sorts, explicit masks).
struct Ref {
  std::vector<double> scores, weights;
  std::vector<std::int32_t> ids;
};

Ref reference(const std::vector<double>& logits, const std::vector<double>& bias, std::int64_t T, std::int64_t E,
              std::int64_t K, const SigmoidRouting& r, const std::vector<std::int32_t>* fixed_ids = nullptr) {
  Ref o;
  const std::int64_t per = E / r.n_group;
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), choice(E);
    for (std::int64_t e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
      choice[e] = s[e] + bias[e];
    }
    std::vector<std::int32_t> sel;
    if (fixed_ids != nullptr) {
      sel.assign(fixed_ids->begin() + t * K, fixed_ids->begin() + (t + 1) * K);
    } else {
      std::vector<std::pair<double, std::int32_t>> groups;
      for (std::int64_t g = 0; g < r.n_group; ++g) {
        std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(c.rbegin(), c.rend());
        groups.push_back({-(c[0] + c[1]), static_cast<std::int32_t>(g)});
      }
      std::sort(groups.begin(), groups.end());
      std::vector<std::pair<double, std::int32_t>> cand;
      for (std::int64_t g = 0; g < r.topk_group; ++g)
        for (std::int64_t i = 0; i < per; ++i) {
          const std::int32_t e = static_cast<std::int32_t>(groups[g].second * per + i);
          cand.push_back({-choice[e], e});
        }
      std::sort(cand.begin(), cand.end());
      for (std::int64_t k = 0; k < K; ++k) sel.push_back(cand[k].second);
    }
    double sum = 0;
    for (std::int32_t e : sel) sum += s[e];
    for (std::int32_t e : sel) {
      o.ids.push_back(e);
      o.weights.push_back((r.norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * r.routed_scaling_factor);
    }
    o.scores.insert(o.scores.end(), s.begin(), s.end());
  }
  return o;
}

TEST(MoeRouterSigmoid, MatchesADoubleReferenceAndItsBackwardTheCentralDifferences) {
  struct Shape {
    std::int64_t T, E, K;
    SigmoidRouting r;
  };
  std::mt19937 rng(5);
  std::normal_distribution<double> n(0.0, 1.0);
  for (const Shape& sh : {Shape{13, 6, 1, {3, 1, true, 1.0f}}, Shape{7, 10, 5, {5, 3, true, 2.5f}},
                          Shape{9, 12, 4, {1, 1, false, 1.0f}}, Shape{5, 8, 8, {2, 2, true, 1.5f}},
                          Shape{0, 8, 2, {4, 2, true, 1.0f}}}) {
    SCOPED_TRACE("T " + std::to_string(sh.T) + " E " + std::to_string(sh.E) + " K " + std::to_string(sh.K));
    std::vector<double> logits(sh.T * sh.E), bias(sh.E), dw(sh.T * sh.K);
    for (double& x : logits) x = static_cast<float>(2.0 * n(rng));  // representable in f32
    for (double& x : bias) x = static_cast<float>(0.1 * n(rng));
    for (double& x : dw) x = static_cast<float>(n(rng));
    const std::vector<float> lf(logits.begin(), logits.end()), bf(bias.begin(), bias.end()), dwf(dw.begin(), dw.end());
    const Routed o = route(lf, bf, sh.T, sh.E, sh.K, sh.r);
    const Ref want = reference(logits, bias, sh.T, sh.E, sh.K, sh.r);
    ASSERT_EQ(o.ids, want.ids);
    const std::vector<float> ww(want.weights.begin(), want.weights.end()), ws(want.scores.begin(), want.scores.end());
    EXPECT_LT(cpu::relative_error(o.weights.data(), ww.data(), sh.T * sh.K), 1e-6);
    EXPECT_LT(cpu::relative_error(o.scores.data(), ws.data(), sh.T * sh.E), 1e-6);
    // Backward (dlogits may alias scores: run it in place) against central differences
    // of sum(weights * dw) with the selection held.
    std::vector<float> d = o.scores;
    cpu::moe_router_sigmoid_backward(d.data(), dwf.data(), d.data(), o.ids.data(), sh.T, sh.E, sh.K, sh.r);
    std::vector<float> fd(d.size());
    const double h = 1e-6;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      auto loss = [&](double delta) {
        std::vector<double> l = logits;
        l[i] += delta;
        const Ref x = reference(l, bias, sh.T, sh.E, sh.K, sh.r, &want.ids);
        return std::inner_product(x.weights.begin(), x.weights.end(), dw.begin(), 0.0);
      };
      fd[i] = static_cast<float>((loss(h) - loss(-h)) / (2 * h));
    }
    EXPECT_LT(cpu::relative_error(d.data(), fd.data(), static_cast<std::int64_t>(d.size())), 1e-5);
  }
}

// The sequence-wise balance loss: statistics, loss and weights against a naive double
// computation, its gradient (joined to the routing's, in place) against central differences
// of the whole sum(weights * dw) + L with the selection held, sequences of several lengths;
// and the statistics of a sequence split over two ranks summing to the whole's.
TEST(MoeRouterSigmoid, SequenceBalanceLossMatchesADoubleReferenceAndItsGradientTheCentralDifferences) {
  struct Shape {
    std::int64_t T, S, E, K;
    SigmoidRouting r;
  };
  std::mt19937 rng(11);
  std::normal_distribution<double> n(0.0, 1.0);
  const double coef = 0.3;
  for (const Shape& sh : {Shape{12, 4, 8, 2, {4, 2, true, 2.5f}}, Shape{10, 5, 6, 3, {3, 2, true, 1.0f}},
                          Shape{9, 9, 12, 4, {1, 1, false, 1.0f}}}) {
    SCOPED_TRACE("T " + std::to_string(sh.T) + " S " + std::to_string(sh.S) + " E " + std::to_string(sh.E));
    const std::int64_t T = sh.T, S = sh.S, E = sh.E, K = sh.K, B = T / S;
    std::vector<double> logits(T * E), bias(E), dw(T * K);
    for (double& x : logits) x = static_cast<float>(2.0 * n(rng));
    for (double& x : bias) x = static_cast<float>(0.1 * n(rng));
    for (double& x : dw) x = static_cast<float>(n(rng));
    const std::vector<float> lf(logits.begin(), logits.end()), bf(bias.begin(), bias.end()), dwf(dw.begin(), dw.end());
    const Routed o = route(lf, bf, T, E, K, sh.r);
    // The naive loss: routing term + coef sum_b sum_i f_bi P_bi, selection held.
    auto total = [&](const std::vector<double>& l) {
      const Ref x = reference(l, bias, T, E, K, sh.r, &o.ids);
      double sum = std::inner_product(x.weights.begin(), x.weights.end(), dw.begin(), 0.0);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < E; ++i) {
          double count = 0, P = 0;
          for (std::int64_t t = b * S; t < (b + 1) * S; ++t) {
            double Z = 0;
            for (std::int64_t j = 0; j < E; ++j) Z += x.scores[t * E + j];
            P += x.scores[t * E + i] / Z / static_cast<double>(S);
            for (std::int64_t k = 0; k < K; ++k) count += o.ids[t * K + k] == i ? 1 : 0;
          }
          sum += coef * static_cast<double>(E) / static_cast<double>(K * S) * count * P;
        }
      return sum;
    };
    std::vector<float> counts(B * E, 0.0f), psum(B * E, 0.0f), w(B * E);
    cpu::moe_router_seq_stats(counts.data(), psum.data(), o.scores.data(), o.ids.data(), T, E, K, S);
    // Split: each sequence's first ceil(S/2) rows on one rank, the rest on the other.
    const std::int64_t a = (S + 1) / 2;
    if (S - a > 0 && a == S - a) {
      std::vector<float> s0, s1;
      std::vector<std::int32_t> i0, i1;
      for (std::int64_t t = 0; t < T; ++t) {
        const bool first = t % S < a;
        auto& sc = first ? s0 : s1;
        auto& id = first ? i0 : i1;
        sc.insert(sc.end(), o.scores.begin() + t * E, o.scores.begin() + (t + 1) * E);
        id.insert(id.end(), o.ids.begin() + t * K, o.ids.begin() + (t + 1) * K);
      }
      std::vector<float> c2(B * E, 0.0f), p2(B * E, 0.0f);
      cpu::moe_router_seq_stats(c2.data(), p2.data(), s0.data(), i0.data(), B * a, E, K, a);
      cpu::moe_router_seq_stats(c2.data(), p2.data(), s1.data(), i1.data(), B * a, E, K, a);
      EXPECT_EQ(c2, counts);
      EXPECT_LT(cpu::relative_error(p2.data(), psum.data(), B * E), 1e-6);
    }
    double loss = 0;
    cpu::moe_router_seq_aux_weights(&loss, w.data(), counts.data(), psum.data(), B, E, K, S, coef, 1.0);
    const Ref plain = reference(logits, bias, T, E, K, sh.r, &o.ids);
    const double routing = std::inner_product(plain.weights.begin(), plain.weights.end(), dw.begin(), 0.0);
    EXPECT_NEAR(loss, total(logits) - routing, 1e-6 * std::abs(total(logits) - routing));
    std::vector<float> d = o.scores;
    cpu::moe_router_sigmoid_backward(d.data(), dwf.data(), d.data(), o.ids.data(), T, E, K, sh.r, w.data(), S);
    std::vector<float> fd(d.size());
    const double h = 1e-6;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      std::vector<double> up = logits, down = logits;
      up[i] += h;
      down[i] -= h;
      fd[i] = static_cast<float>((total(up) - total(down)) / (2 * h));
    }
    EXPECT_LT(cpu::relative_error(d.data(), fd.data(), static_cast<std::int64_t>(d.size())), 1e-5);
    // Every expert's logit moves (the balance term reaches the unchosen ones too).
    std::int64_t moved = 0;
    for (float x : d) moved += x != 0.0f ? 1 : 0;
    EXPECT_EQ(moved, T * E);
  }
  EXPECT_THROW(cpu::moe_router_seq_stats(nullptr, nullptr, nullptr, nullptr, 10, 4, 2, 3), InvalidArgument);
}

TEST(MoeRouterSigmoid, TiesGoToTheLowerGroupAndExpertAndTheBiasSteersOnlyTheChoice) {
  const SigmoidRouting r{4, 2, true, 1.0f};
  const std::vector<float> zero(16, 0.0f);
  Routed o = route(zero, {}, 1, 16, 3, r);
  EXPECT_EQ(o.ids, (std::vector<std::int32_t>{0, 1, 2}));
  // A bias lifts expert 13 (group 3) into the choice; its weight is its unbiased score.
  std::vector<float> bias(16, 0.0f), logits(16, 0.0f);
  bias[13] = 1.0f;
  logits[5] = 1.0f;
  o = route(logits, bias, 1, 16, 2, r);
  EXPECT_EQ(o.ids, (std::vector<std::int32_t>{13, 5}));
  const float s5 = 1.0f / (1.0f + std::exp(-1.0f)), s13 = 0.5f;
  EXPECT_FLOAT_EQ(o.weights[0], s13 / (s13 + s5));
  EXPECT_FLOAT_EQ(o.weights[1], s5 / (s13 + s5));
}

TEST(MoeRouterSigmoid, TheBiasUpdateLowersTheOverloadedAndRaisesTheUnderloaded) {
  std::vector<float> bias = {0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<float> load = {3, 1, 2, 2};  // mean 2
  cpu::moe_router_bias_update(bias.data(), load.data(), 4, 0.001f);
  EXPECT_EQ(bias, (std::vector<float>{0.5f - 0.001f, 0.5f + 0.001f, 0.5f, 0.5f}));
}

TEST(MoeRouterSigmoid, ShapesThatDoNotFitAreOneLineErrors) {
  auto error_of = [](std::int64_t E, std::int64_t K, SigmoidRouting r) {
    try {
      cpu::check_sigmoid_routing(E, K, r);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(10, 2, {4, 1, true, 1}).find("n_group must divide"), std::string::npos);
  EXPECT_NE(error_of(8, 2, {8, 1, true, 1}).find("at least 2 in each group"), std::string::npos);
  EXPECT_NE(error_of(8, 2, {4, 5, true, 1}).find("topk_group must be between 1 and n_group"), std::string::npos);
  EXPECT_NE(error_of(8, 5, {4, 2, true, 1}).find("kept groups' experts (4)"), std::string::npos);
  EXPECT_EQ(error_of(8, 4, {4, 2, true, 1}), "");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
