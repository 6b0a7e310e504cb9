// A naive double-precision reference of the FFN sublayer (layers/moe_layer.h), shared
// by moe_layer_test.cc and moe_layer_mpi_test.cc: the forward (y and the router
// statistics) and its backward by the explicit chain rule (dx and every parameter
// gradient, the aux-loss term included), over ALL experts' weights [E, 3FH].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "peakbound/layers/moe_layer.h"
#include "tests/layers/layer_checks.h"
#include "tests/layers/reference.h"

namespace peakbound::moe_ref {

// The shared pieces (reference.h): values rounded to float so the layer sees exactly
// these, RMSNorm forward and backward (both gradients added), the relative error.
using reference::randn;
using reference::rel_err;
using reference::rms_bwd;
using reference::rms_fwd;
using reference::Vec;

// Parameters (and gradients, same layout) in double. experts: [E, 3FH], every expert.
struct Params {
  Vec w_post, w_gate, experts, shared_gate, shared_up, shared_down, shared_expert_gate, dense_gate, dense_up,
      dense_down;
};

struct Forward {
  Vec h, rstd, probs, weights, y, counts, prob_sums;
  std::vector<int> ids;
};

inline constexpr double kHotGap = 7.0;

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// One row's SwiGLU of width F: out[H] += scale * W_down silu(W_gate h) * (W_up h).
// Weights at wg [F, H], wu [F, H], wd [H, ldd] (column offset col0 into a wider down).
struct Ffn {
  const double *wg, *wu, *wd;
  std::int64_t F, ldd;
};

inline void ffn_fwd(const Ffn& f, const double* h, std::int64_t H, double scale, double* out) {
  for (std::int64_t j = 0; j < f.F; ++j) {
    double g = 0, u = 0;
    for (std::int64_t a = 0; a < H; ++a) g += f.wg[j * H + a] * h[a], u += f.wu[j * H + a] * h[a];
    const double act = g * sigmoid(g) * u;
    for (std::int64_t a = 0; a < H; ++a) out[a] += scale * f.wd[a * f.ldd + j] * act;
  }
}

// Backward of out = ffn(h) for dout: dwg, dwu, dwd (same layout as the weights) and dh added.
inline void ffn_bwd(const Ffn& f, const double* h, std::int64_t H, const double* dout, double* dwg, double* dwu,
                    double* dwd, double* dh) {
  for (std::int64_t j = 0; j < f.F; ++j) {
    double g = 0, u = 0;
    for (std::int64_t a = 0; a < H; ++a) g += f.wg[j * H + a] * h[a], u += f.wu[j * H + a] * h[a];
    const double s = sigmoid(g), silu = g * s, act = silu * u;
    double dact = 0;
    for (std::int64_t a = 0; a < H; ++a) {
      dact += f.wd[a * f.ldd + j] * dout[a];
      dwd[a * f.ldd + j] += dout[a] * act;
    }
    const double dg = dact * u * s * (1 + g * (1 - s)), du = dact * silu;
    for (std::int64_t a = 0; a < H; ++a) {
      dwg[j * H + a] += dg * h[a];
      dwu[j * H + a] += du * h[a];
      dh[a] += dg * f.wg[j * H + a] + du * f.wu[j * H + a];
    }
  }
}

inline Ffn expert_ffn(const MoeLayerConfig& c, const double* base) {
  const std::int64_t F = c.ffn, H = c.hidden;
  return {base, base + F * H, base + 2 * F * H, F, F};
}

// Forward of the sublayer on T tokens.
inline Forward forward(const MoeLayerConfig& c, const Vec& x, const Params& P) {
  const std::int64_t H = c.hidden, T = static_cast<std::int64_t>(x.size()) / H;
  Forward f;
  rms_fwd(x, P.w_post, H, c.rms_eps, f.h, f.rstd);
  f.y = x;
  if (c.dense()) {
    const Ffn d{P.dense_gate.data(), P.dense_up.data(), P.dense_down.data(), c.dense_ffn, c.dense_ffn};
    for (std::int64_t t = 0; t < T; ++t) ffn_fwd(d, &f.h[t * H], H, 1.0, &f.y[t * H]);
    return f;
  }
  const std::int64_t E = c.experts, K = c.top_k, X = 3 * c.ffn * H;
  f.probs.assign(static_cast<std::size_t>(T * E), 0);
  f.weights.assign(static_cast<std::size_t>(T * K), 0);
  f.ids.assign(static_cast<std::size_t>(T * K), 0);
  f.counts.assign(static_cast<std::size_t>(E), 0);
  f.prob_sums.assign(static_cast<std::size_t>(E), 0);
  for (std::int64_t t = 0; t < T; ++t) {
    double* p = &f.probs[t * E];
    double mx = -1e300;
    for (std::int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (std::int64_t a = 0; a < H; ++a) l += f.h[t * H + a] * P.w_gate[e * H + a];
      p[e] = l;
      mx = std::max(mx, l);
    }
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (std::int64_t e = 0; e < E; ++e) p[e] /= sum, f.prob_sums[e] += p[e];
    std::vector<int> order(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double sel = 0;
    for (std::int64_t k = 0; k < K; ++k) sel += p[order[k]];
    for (std::int64_t k = 0; k < K; ++k) {
      const int e = order[k];
      f.ids[t * K + k] = e;
      f.weights[t * K + k] = c.norm_topk_prob ? p[e] / sel : p[e];
      f.counts[e] += 1;
      ffn_fwd(expert_ffn(c, &P.experts[e * X]), &f.h[t * H], H, f.weights[t * K + k], &f.y[t * H]);
    }
    if (c.shared_experts > 0) {
      const std::int64_t W = c.side_ffn();
      const Ffn s{P.shared_gate.data(), P.shared_up.data(), P.shared_down.data(), W, W};
      double scale = 1.0;
      if (c.shared_gate) {
        double z = 0;
        for (std::int64_t a = 0; a < H; ++a) z += f.h[t * H + a] * P.shared_expert_gate[a];
        scale = sigmoid(z);
      }
      ffn_fwd(s, &f.h[t * H], H, scale, &f.y[t * H]);
    }
  }
  return f;
}

inline Params zeros_like(const Params& P) {
  auto z = [](const Vec& v) { return Vec(v.size(), 0.0); };
  return {z(P.w_post),      z(P.w_gate),      z(P.experts),          z(P.shared_gate), z(P.shared_up),
          z(P.shared_down), z(P.shared_expert_gate), z(P.dense_gate), z(P.dense_up),    z(P.dense_down)};
}

// dx (written) and the parameter gradients (written, G resized) for dy; aux_grad [E]
// (empty: none) is d loss / d probs[t, e] for every token. gate_scale (optional, [H]):
// the magnitude of d shared_expert_gate's terms, sum_t s(1-s) sum_j |dy[t,j] o[t,j]| |h[t]|
// (o the shared output): each token's gradient is one dot product <dy, o>, whose f32
// error is relative to this, not to its (possibly cancelled) value.
inline void backward(const MoeLayerConfig& c, const Vec& x, const Params& P, const Vec& dy, const Vec& aux_grad,
                     Vec& dx, Params& G, Vec* gate_scale = nullptr) {
  const std::int64_t H = c.hidden, T = static_cast<std::int64_t>(x.size()) / H;
  const Forward f = forward(c, x, P);
  G = zeros_like(P);
  if (gate_scale) gate_scale->assign(static_cast<std::size_t>(H), 0.0);
  Vec dh(x.size(), 0.0);
  if (c.dense()) {
    const Ffn d{P.dense_gate.data(), P.dense_up.data(), P.dense_down.data(), c.dense_ffn, c.dense_ffn};
    for (std::int64_t t = 0; t < T; ++t)
      ffn_bwd(d, &f.h[t * H], H, &dy[t * H], G.dense_gate.data(), G.dense_up.data(), G.dense_down.data(), &dh[t * H]);
  } else {
    const std::int64_t E = c.experts, K = c.top_k, X = 3 * c.ffn * H, F = c.ffn;
    for (std::int64_t t = 0; t < T; ++t) {
      const double* ht = &f.h[t * H];
      const double* dyt = &dy[t * H];
      // Routed: d weight = <dy, expert out>; the expert sees weight * dy.
      Vec dw(static_cast<std::size_t>(K), 0.0), scaled(static_cast<std::size_t>(H));
      for (std::int64_t k = 0; k < K; ++k) {
        const int e = f.ids[t * K + k];
        const Ffn ex = expert_ffn(c, &P.experts[e * X]);
        Vec o(static_cast<std::size_t>(H), 0.0);
        ffn_fwd(ex, ht, H, 1.0, o.data());
        for (std::int64_t a = 0; a < H; ++a) dw[k] += dyt[a] * o[a], scaled[a] = f.weights[t * K + k] * dyt[a];
        double* g = &G.experts[e * X];
        ffn_bwd(ex, ht, H, scaled.data(), g, g + F * H, g + 2 * F * H, &dh[t * H]);
      }
      // Router: selected-prob gradient, aux term, softmax.
      const double* p = &f.probs[t * E];
      Vec dp(static_cast<std::size_t>(E), 0.0);
      for (std::int64_t e = 0; e < E; ++e) dp[e] = aux_grad.empty() ? 0.0 : aux_grad[e];
      double sel = 0, wdot = 0;
      for (std::int64_t k = 0; k < K; ++k) sel += p[f.ids[t * K + k]], wdot += dw[k] * f.weights[t * K + k];
      for (std::int64_t k = 0; k < K; ++k)
        dp[f.ids[t * K + k]] += c.norm_topk_prob ? (dw[k] - wdot) / sel : dw[k];
      double pdp = 0;
      for (std::int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
      for (std::int64_t e = 0; e < E; ++e) {
        const double dl = p[e] * (dp[e] - pdp);
        for (std::int64_t a = 0; a < H; ++a) {
          G.w_gate[e * H + a] += dl * ht[a];
          dh[t * H + a] += dl * P.w_gate[e * H + a];
        }
      }
      // Shared experts (and their gate).
      if (c.shared_experts > 0) {
        const std::int64_t W = c.side_ffn();
        const Ffn s{P.shared_gate.data(), P.shared_up.data(), P.shared_down.data(), W, W};
        Vec ds(dyt, dyt + H);
        if (c.shared_gate) {
          double z = 0;
          for (std::int64_t a = 0; a < H; ++a) z += ht[a] * P.shared_expert_gate[a];
          const double sg = sigmoid(z);
          Vec o(static_cast<std::size_t>(H), 0.0);
          ffn_fwd(s, ht, H, 1.0, o.data());
          double dot = 0, mag = 0;
          for (std::int64_t a = 0; a < H; ++a) {
            dot += dyt[a] * o[a];
            mag += std::abs(dyt[a] * o[a]);
            ds[a] = sg * dyt[a];
          }
          const double dz = sg * (1 - sg) * dot;
          if (gate_scale)
            for (std::int64_t a = 0; a < H; ++a) (*gate_scale)[a] += sg * (1 - sg) * mag * std::abs(ht[a]);
          for (std::int64_t a = 0; a < H; ++a) {
            G.shared_expert_gate[a] += dz * ht[a];
            dh[t * H + a] += dz * P.shared_expert_gate[a];
          }
        }
        ffn_bwd(s, ht, H, ds.data(), G.shared_gate.data(), G.shared_up.data(), G.shared_down.data(), &dh[t * H]);
      }
    }
  }
  dx = dy;
  rms_bwd(x, P.w_post, f.rstd, dh, H, dx, G.w_post);
}

// Random parameters for config c (every expert). hot_expert >= 0 adds a large bias to
// that expert's router row along the direction of w_post (so every token picks it).
inline Params random_params(const MoeLayerConfig& c, std::mt19937& rng, int hot_expert = -1) {
  const std::int64_t H = c.hidden;
  const double in_h = 1.0 / std::sqrt(double(H));
  Params P;
  P.w_post = randn(H, rng, 1.0, 0.1);
  if (c.dense()) {
    const std::int64_t F = c.dense_ffn;
    P.dense_gate = randn(F * H, rng, 0, in_h);
    P.dense_up = randn(F * H, rng, 0, in_h);
    P.dense_down = randn(H * F, rng, 0, 1.0 / std::sqrt(double(F)));
    return P;
  }
  const std::int64_t E = c.experts, F = c.ffn;
  P.w_gate = randn(E * H, rng, 0, in_h);
  P.experts.resize(static_cast<std::size_t>(E * 3 * F * H));
  for (std::int64_t e = 0; e < E; ++e) {
    const Vec g = randn(2 * F * H, rng, 0, in_h), d = randn(H * F, rng, 0, 1.0 / std::sqrt(double(F)));
    std::copy(g.begin(), g.end(), P.experts.begin() + e * 3 * F * H);
    std::copy(d.begin(), d.end(), P.experts.begin() + e * 3 * F * H + 2 * F * H);
  }
  if (c.shared_experts > 0) {
    const std::int64_t W = c.side_ffn();
    P.shared_gate = randn(W * H, rng, 0, in_h);
    P.shared_up = randn(W * H, rng, 0, in_h);
    P.shared_down = randn(H * W, rng, 0, 1.0 / std::sqrt(double(W)));
  }
  if (c.shared_gate) P.shared_expert_gate = randn(H, rng, 0, in_h);
  if (hot_expert >= 0) {
    // logits_e = h . w_gate[e], h = x * rstd * w_post. The tests that use this draw x
    // with mean 1 (h ~ 1 elementwise), so a row shifted by +HOT_GAP/H has a logit
    // ~HOT_GAP above the others (whose logits have sd ~1) for every token: every token's
    // first choice is hot_expert. Not far more: a saturated softmax (p ~ 1 - 1e-9) has a
    // gradient below f32's resolution, which no f32 router can match to 1e-5.
    for (std::int64_t a = 0; a < H; ++a)
      P.w_gate[hot_expert * H + a] = static_cast<float>(kHotGap / H + P.w_gate[hot_expert * H + a]);
  }
  return P;
}

// For the bf16 tests: every value rounded to bf16 and widened back, so a bf16 layer and
// an f32 layer given these see exactly the same inputs.
inline void round_to_bf16(Vec& v) {
  for (double& x : v) x = to_f32(to_bf16(static_cast<float>(x)));
}
inline void round_to_bf16(Params& P) {
  for (Vec* v : {&P.w_post, &P.w_gate, &P.experts, &P.shared_gate, &P.shared_up, &P.shared_down,
                 &P.shared_expert_gate, &P.dense_gate, &P.dense_up, &P.dense_down})
    round_to_bf16(*v);
}

// The smallest router margin over the tokens of f: min_t log(p_(K) / p_(K+1)), the logit
// gap between the last chosen expert and the first left out (infinity when K = E). A
// bf16 router's logits differ from an f32 router's by about 1e-3 (h rounds by 2^-9), so a
// margin well above that keeps both choosing the same experts.
inline double topk_margin(const Forward& f, std::int64_t T, std::int64_t E, std::int64_t K) {
  double m = INFINITY;
  if (K >= E) return m;
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<double> p(f.probs.begin() + t * E, f.probs.begin() + (t + 1) * E);
    std::sort(p.begin(), p.end(), std::greater<>());
    m = std::min(m, std::log(p[static_cast<std::size_t>(K - 1)] / p[static_cast<std::size_t>(K)]));
  }
  return m;
}

using layer_test::cosine;  // cos(a, b) of two gradients (tests/layers/layer_checks.h)

}  // namespace peakbound::moe_ref
