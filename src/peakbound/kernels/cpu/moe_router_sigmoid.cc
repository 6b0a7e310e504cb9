#include "peakbound/kernels/cpu/moe_router_sigmoid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/moe_router.h"

namespace peakbound::cpu {

void check_sigmoid_routing(std::int64_t E, std::int64_t K, const SigmoidRouting& r) {
  const std::string shape = "sigmoid routing (E " + std::to_string(E) + ", top_k " + std::to_string(K) +
                            ", n_group " + std::to_string(r.n_group) + ", topk_group " +
                            std::to_string(r.topk_group) + ")";
  if (E < 2 || r.n_group < 1 || E % r.n_group != 0 || E / r.n_group < 2)
    throw InvalidArgument(shape + ": n_group must divide the experts with at least 2 in each group");
  if (r.topk_group < 1 || r.topk_group > r.n_group)
    throw InvalidArgument(shape + ": topk_group must be between 1 and n_group");
  if (K < 1 || K > r.topk_group * (E / r.n_group))
    throw InvalidArgument(shape + ": top_k must be between 1 and the kept groups' experts (" +
                          std::to_string(r.topk_group * (E / r.n_group)) + ")");
}

void moe_router_sigmoid_forward(float* scores, std::int32_t* ids, float* weights, const float* logits,
                                const float* bias, std::int64_t T, std::int64_t E, std::int64_t K,
                                const SigmoidRouting& r) {
  check_sigmoid_routing(E, K, r);
  const std::int64_t G = r.n_group, per = E / G;
  const float kOut = -std::numeric_limits<float>::infinity();
  std::vector<float> choice(static_cast<std::size_t>(E)), group(static_cast<std::size_t>(G));
  std::vector<std::int32_t> order(static_cast<std::size_t>(std::max(E, G)));
  std::vector<bool> kept(static_cast<std::size_t>(G));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float* s = scores + t * E;
    for (std::int64_t e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[static_cast<std::size_t>(e)] = bias != nullptr ? s[e] + bias[e] : s[e];
    }
    // Each group's score: its two largest choices, summed largest first (topk(2).sum()).
    for (std::int64_t g = 0; g < G; ++g) {
      const float* c = choice.data() + g * per;
      float a = kOut, b = kOut;
      for (std::int64_t i = 0; i < per; ++i) {
        if (c[i] > a) {
          b = a;
          a = c[i];
        } else if (c[i] > b) {
          b = c[i];
        }
      }
      group[static_cast<std::size_t>(g)] = a + b;
    }
    top_k_descending(order.data(), group.data(), G, r.topk_group);
    std::fill(kept.begin(), kept.end(), false);
    for (std::int64_t g = 0; g < r.topk_group; ++g) kept[static_cast<std::size_t>(order[static_cast<std::size_t>(g)])] = true;
    for (std::int64_t e = 0; e < E; ++e)
      if (!kept[static_cast<std::size_t>(e / per)]) choice[static_cast<std::size_t>(e)] = kOut;
    top_k_descending(order.data(), choice.data(), E, K);
    std::int32_t* id = ids + t * K;
    float* w = weights + t * K;
    float sum = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) {
      id[k] = order[static_cast<std::size_t>(k)];
      w[k] = s[id[k]];
      sum += w[k];
    }
    if (r.norm_topk_prob) {
      const float denominator = sum + 1e-20f;
      for (std::int64_t k = 0; k < K; ++k) w[k] /= denominator;
    }
    for (std::int64_t k = 0; k < K; ++k) w[k] *= r.routed_scaling_factor;
  }
}

namespace {

void check_seq_tokens(std::int64_t T, std::int64_t seq_tokens, const char* what) {
  if (seq_tokens < 1 || T % seq_tokens != 0)
    throw InvalidArgument(std::string(what) + ": seq_tokens must be >= 1 and divide the " + std::to_string(T) +
                          " tokens, got " + std::to_string(seq_tokens));
}

}  // namespace

void moe_router_sigmoid_backward(float* dlogits, const float* dweights, const float* scores,
                                 const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                                 const SigmoidRouting& r, const float* seq_w, std::int64_t seq_tokens) {
  check_sigmoid_routing(E, K, r);
  if (seq_w != nullptr) check_seq_tokens(T, seq_tokens, "moe_router_sigmoid_backward");
  const double c = r.routed_scaling_factor;
  std::vector<double> sel(static_cast<std::size_t>(K));
  std::vector<double> row(seq_w != nullptr ? static_cast<std::size_t>(E) : 0);
  for (std::int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    // The sequence-wise term's coefficient per expert, from the row read whole before
    // dlogits (which may alias it) is written.
    if (seq_w != nullptr) {
      const float* w = seq_w + (t / seq_tokens) * E;
      double Z = 0.0, A = 0.0;
      for (std::int64_t i = 0; i < E; ++i) {
        Z += s[i];
        A += static_cast<double>(w[i]) * s[i];
      }
      for (std::int64_t i = 0; i < E; ++i) {
        const double si = s[i];
        row[static_cast<std::size_t>(i)] = (w[i] / Z - A / (Z * Z)) * si * (1.0 - si);
      }
    }
    const std::int32_t* id = ids + t * K;
    const float* dw = dweights + t * K;
    double sum = 0.0, dot = 0.0;  // sum_k s_k, sum_k dw_k s_k
    for (std::int64_t k = 0; k < K; ++k) {
      sel[static_cast<std::size_t>(k)] = s[id[k]];
      sum += s[id[k]];
      dot += static_cast<double>(dw[k]) * s[id[k]];
    }
    const double D = sum + 1e-20;
    float* dl = dlogits + t * E;
    std::fill(dl, dl + E, 0.0f);  // every score is read above, before this (aliasing)
    for (std::int64_t k = 0; k < K; ++k) {
      const double sk = sel[static_cast<std::size_t>(k)];
      const double ds = r.norm_topk_prob ? c * (dw[k] * D - dot) / (D * D) : c * dw[k];
      dl[id[k]] = static_cast<float>(ds * sk * (1.0 - sk));
    }
    if (seq_w != nullptr) {
      for (std::int64_t i = 0; i < E; ++i)
        dl[i] = static_cast<float>(static_cast<double>(dl[i]) + row[static_cast<std::size_t>(i)]);
    }
  }
}

void moe_router_seq_stats(float* counts, float* psum, const float* scores, const std::int32_t* ids, std::int64_t T,
                          std::int64_t E, std::int64_t K, std::int64_t seq_tokens) {
  check_seq_tokens(T, seq_tokens, "moe_router_seq_stats");
  for (std::int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    const std::int64_t b = t / seq_tokens;
    double Z = 0.0;
    for (std::int64_t i = 0; i < E; ++i) Z += s[i];
    float* ps = psum + b * E;
    for (std::int64_t i = 0; i < E; ++i) ps[i] = static_cast<float>(ps[i] + s[i] / Z);
    for (std::int64_t k = 0; k < K; ++k) counts[b * E + ids[t * K + k]] += 1.0f;
  }
}

void moe_router_seq_aux_weights(double* loss, float* seq_w, const float* counts, const float* psum,
                                std::int64_t B, std::int64_t E, std::int64_t K, std::int64_t S, double coef,
                                double scale) {
  if (B < 0 || E < 1 || K < 1 || K > E || S < 1)
    throw InvalidArgument("moe_router_seq_aux_weights: need B >= 0, 1 <= K <= E and S >= 1, got B " +
                          std::to_string(B) + ", E " + std::to_string(E) + ", K " + std::to_string(K) + ", S " +
                          std::to_string(S));
  const double fk = static_cast<double>(E) / (static_cast<double>(K) * static_cast<double>(S));
  double sum = 0.0;
  for (std::int64_t x = 0; x < B * E; ++x) {
    const double f = fk * counts[x];
    sum += coef * f * (psum[x] / static_cast<double>(S));
    if (seq_w != nullptr) seq_w[x] = static_cast<float>(scale * coef * f / static_cast<double>(S));
  }
  if (loss != nullptr) *loss = sum;
}

void moe_router_bias_update(float* bias, const float* load, std::int64_t E, float speed) {
  double total = 0.0;
  for (std::int64_t e = 0; e < E; ++e) total += load[e];
  const double mean = E > 0 ? total / static_cast<double>(E) : 0.0;
  for (std::int64_t e = 0; e < E; ++e) {
    const double err = mean - static_cast<double>(load[e]);
    bias[e] += err > 0 ? speed : (err < 0 ? -speed : 0.0f);
  }
}

}  // namespace peakbound::cpu
