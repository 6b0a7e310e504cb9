// The MoE router (gate) of Qwen3-MoE and Mixtral as Hugging Face transformers computes
// it (Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock.forward and
// load_balancing_loss_func), llm.c style over raw row-major pointers. The GEMMs around
// it (logits = x W_gate^T, dW_gate += dlogits^T x, dx = dlogits W_gate) are ops::gemm
// calls in layers/moe_router.cc; these kernels are the part between them.
//
//   probs   = softmax(logits) over E, in f32
//   ids     = the K largest probs per token, in descending order of prob; ties go to the
//             LOWER expert index first (torch.topk does not promise a tie order; ours is
//             fixed so that runs are reproducible)
//   weights = the selected probs; with norm_topk_prob (Qwen3-MoE's config field, always
//             on for Mixtral, whose softmax over the top-k logits is the same number)
//             divided by their sum
//
// Shapes: T tokens (>= 0), E experts (>= 1), K = top_k (1 <= K <= E).
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// The routers' top-k order (this softmax router's and moe_router_sigmoid.h's): WRITES
// order[0..k) with the indices of the k largest of v[0..n), in descending order of value,
// ties to the LOWER index first (a strict total order, so the selection does not depend on
// the sort's implementation). order holds n entries; 0 <= k <= n.
void top_k_descending(std::int32_t* order, const float* v, std::int64_t n, std::int64_t k);

// logits [T, E] -> probs [T, E], ids [T, K] int32, weights [T, K], all WRITTEN. probs may
// alias logits (each row is read before it is written).
void moe_router_forward(float* probs, std::int32_t* ids, float* weights, const float* logits, std::int64_t T,
                        std::int64_t E, std::int64_t K, bool norm_topk_prob);

// The load-balancing statistics of these T tokens, ADDED INTO counts [E] and prob_sums [E]:
//   counts[e]    += number of (token, slot) pairs routed to e  (sum over t and k of ids[t,k] == e)
//   prob_sums[e] += sum over t of probs[t, e]
// Summed over every MoE layer of one forward (and nothing else), they give transformers'
// aux loss through moe_aux_loss. Counts are exact integers in f32 below 2^24 slots.
// prob_sums may be null (counts only: a layer's expert loads for the aux-free bias update).
void moe_router_stats(float* counts, float* prob_sums, const float* probs, const std::int32_t* ids, std::int64_t T,
                      std::int64_t E, std::int64_t K);

// transformers' load_balancing_loss_func over N routed rows (N = tokens x MoE layers,
// the rows of its concatenated gate logits), from the summed statistics:
//   aux = E / N^2 * sum_e counts[e] * prob_sums[e]
// (tokens_per_expert[k, e] = mean over rows of one_hot(ids[:, k])[e], router_prob_per_expert[e]
// = mean over rows of probs[:, e], aux = E * sum_{k,e} tokens_per_expert[k, e] *
// router_prob_per_expert[e]). Writes loss[0] = aux (unscaled) and
//   aux_grad[e] = coef * E * counts[e] / N^2   (= d(coef * aux) / d probs[t, e] for every row t;
//                                               counts come from a top-k: not differentiable)
// loss or aux_grad may be null. N >= 1. Computed in double, stored in f32.
void moe_aux_loss(float* loss, float* aux_grad, const float* counts, const float* prob_sums, std::int64_t E,
                  std::int64_t N, float coef);

// Backward of moe_router_forward plus the aux loss's term: dweights [T, K] (d loss / d
// weights, what MoeDispatch::backward writes), probs [T, E] and ids [T, K] from the
// forward, aux_grad [E] (from moe_aux_loss; null: no aux term) -> dlogits [T, E], WRITTEN.
// dlogits may alias probs (each row's probs are read before it is written).
//   dp[t, e]      = aux_grad[e] + (e == ids[t, k] ? dsel[t, k] : 0)
//   dsel[t, k]    = dweights[t, k]                                     (no renormalization)
//                 = (dweights[t, k] - sum_j dweights[t, j] weights[t, j]) / S_t   (norm_topk_prob,
//                   S_t = sum_j probs[t, ids[t, j]], weights = probs / S_t)
//   dlogits[t, e] = probs[t, e] * (dp[t, e] - sum_j probs[t, j] dp[t, j])   (softmax)
void moe_router_backward(float* dlogits, const float* dweights, const float* probs, const std::int32_t* ids,
                         const float* aux_grad, std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob);

}  // namespace peakbound::cpu
