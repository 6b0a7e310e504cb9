#include "peakbound/kernels/cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace peakbound::cpu {

void top_k_descending(std::int32_t* order, const float* v, std::int64_t n, std::int64_t k) {
  std::iota(order, order + n, 0);
  std::partial_sort(order, order + k, order + n,
                    [v](std::int32_t a, std::int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
}

void moe_router_forward(float* probs, std::int32_t* ids, float* weights, const float* logits, std::int64_t T,
                        std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    // Softmax with the max subtracted (as torch does); the sum in double so that the
    // rows of a 60-expert router sum to 1 within an ulp or two.
    const float mx = *std::max_element(l, l + E);
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - mx);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t e = 0; e < E; ++e) p[e] *= inv;

    top_k_descending(order.data(), p, E, K);  // descending prob, ties to the lower index
    std::int32_t* id = ids + t * K;
    float* w = weights + t * K;
    double selected = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      id[k] = order[static_cast<std::size_t>(k)];
      w[k] = p[id[k]];
      selected += w[k];
    }
    // transformers: routing_weights /= routing_weights.sum(dim=-1, keepdim=True).
    if (norm_topk_prob)
      for (std::int64_t k = 0; k < K; ++k) w[k] = static_cast<float>(w[k] / selected);
  }
}

void moe_router_stats(float* counts, float* prob_sums, const float* probs, const std::int32_t* ids, std::int64_t T,
                      std::int64_t E, std::int64_t K) {
  std::vector<double> c(static_cast<std::size_t>(E), 0.0), s(static_cast<std::size_t>(E), 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < K; ++k) c[static_cast<std::size_t>(ids[t * K + k])] += 1.0;
    if (prob_sums != nullptr)
      for (std::int64_t e = 0; e < E; ++e) s[static_cast<std::size_t>(e)] += probs[t * E + e];
  }
  for (std::int64_t e = 0; e < E; ++e) {
    counts[e] += static_cast<float>(c[static_cast<std::size_t>(e)]);
    if (prob_sums != nullptr) prob_sums[e] += static_cast<float>(s[static_cast<std::size_t>(e)]);
  }
}

void moe_aux_loss(float* loss, float* aux_grad, const float* counts, const float* prob_sums, std::int64_t E,
                  std::int64_t N, float coef) {
  const double n2 = static_cast<double>(N) * static_cast<double>(N);
  if (loss != nullptr) {
    double acc = 0.0;
    for (std::int64_t e = 0; e < E; ++e) acc += static_cast<double>(counts[e]) * prob_sums[e];
    loss[0] = static_cast<float>(static_cast<double>(E) * acc / n2);
  }
  if (aux_grad != nullptr)
    for (std::int64_t e = 0; e < E; ++e)
      aux_grad[e] = static_cast<float>(static_cast<double>(coef) * static_cast<double>(E) * counts[e] / n2);
}

void moe_router_backward(float* dlogits, const float* dweights, const float* probs, const std::int32_t* ids,
                         const float* aux_grad, std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  std::vector<double> psel(static_cast<std::size_t>(K)), dsel(static_cast<std::size_t>(K));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* p = probs + t * E;
    const std::int32_t* id = ids + t * K;
    const float* dw = dweights + t * K;
    double S = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      psel[static_cast<std::size_t>(k)] = p[id[k]];
      S += p[id[k]];
    }
    // d loss / d selected prob, through w_k = p_k / S when renormalized.
    if (norm_topk_prob) {
      double dot = 0.0;  // sum_j dw_j w_j
      for (std::int64_t k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * psel[static_cast<std::size_t>(k)] / S;
      for (std::int64_t k = 0; k < K; ++k) dsel[static_cast<std::size_t>(k)] = (dw[k] - dot) / S;
    } else {
      for (std::int64_t k = 0; k < K; ++k) dsel[static_cast<std::size_t>(k)] = dw[k];
    }
    // Softmax backward: dlogit_e = p_e (dp_e - sum_j p_j dp_j), with dp = aux_grad + the
    // selected slots' terms. Every p_e is read before dlogits[e] is written (aliasing).
    double pdp = 0.0;
    if (aux_grad != nullptr)
      for (std::int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * aux_grad[e];
    for (std::int64_t k = 0; k < K; ++k) pdp += psel[static_cast<std::size_t>(k)] * dsel[static_cast<std::size_t>(k)];
    float* dl = dlogits + t * E;
    for (std::int64_t e = 0; e < E; ++e) {
      const double a = aux_grad != nullptr ? aux_grad[e] : 0.0;
      dl[e] = static_cast<float>(p[e] * (a - pdp));
    }
    // The selected entries again, whole, in double (not a float add onto a rounded
    // value: p_e (a_e - pdp) and p_e dsel_k nearly cancel when the router is confident).
    for (std::int64_t k = 0; k < K; ++k) {
      const double a = aux_grad != nullptr ? aux_grad[id[k]] : 0.0;
      const std::size_t i = static_cast<std::size_t>(k);
      dl[id[k]] = static_cast<float>(psel[i] * (a + dsel[i] - pdp));
    }
  }
}

}  // namespace peakbound::cpu
