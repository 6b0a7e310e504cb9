#include "peakbound/kernels/cuda/moe_router.h"

#include <string>

#include "peakbound/kernels/cuda/launch.cuh"

namespace peakbound::cuda {

namespace {

__global__ void router_forward_k(float* probs, std::int32_t* ids, float* weights, const float* logits, std::int64_t T,
                                 std::int64_t E, std::int64_t K, bool norm) {
  for (std::int64_t t = first_index(); t < T; t += grid_stride()) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    float mx = l[0];
    for (std::int64_t e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      p[e] = expf(l[e] - mx);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t e = 0; e < E; ++e) p[e] *= inv;
    // Top-k by repeated selection: the largest prob not yet taken, ties to the lower
    // index (the CPU's strict order, so the same ids in the same order).
    std::int32_t* id = ids + t * K;
    float* w = weights + t * K;
    double selected = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      std::int32_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (std::int64_t j = 0; j < k; ++j) taken = taken || id[j] == e;
        if (taken) continue;
        if (best < 0 || p[e] > p[best]) best = static_cast<std::int32_t>(e);
      }
      id[k] = best;
      w[k] = p[best];
      selected += w[k];
    }
    if (norm)
      for (std::int64_t k = 0; k < K; ++k) w[k] = static_cast<float>(w[k] / selected);
  }
}

__global__ void router_stats_k(float* counts, float* prob_sums, const float* probs, const std::int32_t* ids,
                               std::int64_t T, std::int64_t E, std::int64_t K) {
  for (std::int64_t e = first_index(); e < E; e += grid_stride()) {
    double c = 0.0, s = 0.0;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t k = 0; k < K; ++k) c += ids[t * K + k] == e ? 1.0 : 0.0;
      if (prob_sums != nullptr) s += probs[t * E + e];
    }
    counts[e] += static_cast<float>(c);
    if (prob_sums != nullptr) prob_sums[e] += static_cast<float>(s);
  }
}

__global__ void aux_loss_k(float* loss, float* aux_grad, const float* counts, const float* prob_sums, std::int64_t E,
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

__global__ void router_backward_k(float* dlogits, const float* dweights, const float* probs, const std::int32_t* ids,
                                  const float* aux_grad, std::int64_t T, std::int64_t E, std::int64_t K, bool norm) {
  double psel[kMaxTopK], dsel[kMaxTopK];
  for (std::int64_t t = first_index(); t < T; t += grid_stride()) {
    const float* p = probs + t * E;
    const std::int32_t* id = ids + t * K;
    const float* dw = dweights + t * K;
    double S = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      psel[k] = p[id[k]];
      S += p[id[k]];
    }
    if (norm) {
      double dot = 0.0;
      for (std::int64_t k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * psel[k] / S;
      for (std::int64_t k = 0; k < K; ++k) dsel[k] = (dw[k] - dot) / S;
    } else {
      for (std::int64_t k = 0; k < K; ++k) dsel[k] = dw[k];
    }
    double pdp = 0.0;
    if (aux_grad != nullptr)
      for (std::int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * aux_grad[e];
    for (std::int64_t k = 0; k < K; ++k) pdp += psel[k] * dsel[k];
    float* dl = dlogits + t * E;
    for (std::int64_t e = 0; e < E; ++e) {
      const double a = aux_grad != nullptr ? aux_grad[e] : 0.0;
      dl[e] = static_cast<float>(p[e] * (a - pdp));
    }
    for (std::int64_t k = 0; k < K; ++k) {
      const double a = aux_grad != nullptr ? aux_grad[id[k]] : 0.0;
      dl[id[k]] = static_cast<float>(psel[k] * (a + dsel[k] - pdp));
    }
  }
}

void check_k(std::int64_t K) {
  if (K > kMaxTopK)
    throw InvalidArgument("cuda moe router: top_k " + std::to_string(K) + " above the kernel's " +
                          std::to_string(kMaxTopK));
}

}  // namespace

void moe_router_forward(void* s, float* probs, std::int32_t* ids, float* weights, const float* logits, std::int64_t T,
                        std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  check_k(K);
  if (T <= 0) return;
  router_forward_k<<<blocks_for(T), kThreads, 0, native(s)>>>(probs, ids, weights, logits, T, E, K, norm_topk_prob);
  check_launch("moe_router_forward");
}

void moe_router_stats(void* s, float* counts, float* prob_sums, const float* probs, const std::int32_t* ids,
                      std::int64_t T, std::int64_t E, std::int64_t K) {
  if (T <= 0 || E <= 0) return;
  router_stats_k<<<blocks_for(E), kThreads, 0, native(s)>>>(counts, prob_sums, probs, ids, T, E, K);
  check_launch("moe_router_stats");
}

void moe_aux_loss(void* s, float* loss, float* aux_grad, const float* counts, const float* prob_sums, std::int64_t E,
                  std::int64_t N, float coef) {
  aux_loss_k<<<1, 1, 0, native(s)>>>(loss, aux_grad, counts, prob_sums, E, N, coef);
  check_launch("moe_aux_loss");
}

void moe_router_backward(void* s, float* dlogits, const float* dweights, const float* probs, const std::int32_t* ids,
                         const float* aux_grad, std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  check_k(K);
  if (T <= 0) return;
  router_backward_k<<<blocks_for(T), kThreads, 0, native(s)>>>(dlogits, dweights, probs, ids, aux_grad, T, E, K,
                                                               norm_topk_prob);
  check_launch("moe_router_backward");
}

}  // namespace peakbound::cuda
