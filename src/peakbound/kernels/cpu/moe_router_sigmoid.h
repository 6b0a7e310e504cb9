// DeepSeek-V3's router (Kimi-K2's too) as Hugging Face transformers computes it
// (DeepseekV3TopkRouter.forward), llm.c style over raw row-major pointers, and its backward;
// with the auxiliary-loss-free balancing update of the DeepSeek-V3 report (its section
// 2.1.2). The GEMM before it (logits = x W_gate^T, in f32) is the caller's.
//
//   scores  = sigmoid(logits)                       [T, E], f32
//   choice  = scores + bias                         (e_score_correction_bias: selection only)
//   group g = experts [g E/G, (g+1) E/G); its score = the sum of its two largest choices
//   the topk_group groups of largest score are kept; the other groups' choices are -inf
//   ids     = the K largest kept choices per token, in descending order of choice; ties
//             (in both top-ks) go to the LOWER index first (torch.topk promises no order;
//             ours is fixed so that runs are reproducible)
//   weights = scores[ids] (without the bias); with norm_topk_prob divided by
//             (their sum + 1e-20); then times routed_scaling_factor
//
// Shapes: T tokens (>= 0), E experts, G = n_group dividing E with at least 2 experts a
// group (transformers takes a top-2 in each), 1 <= topk_group <= G, and K = top_k at most
// the kept groups' experts. bias may be null (zeros). Checked: InvalidArgument.
#pragma once

#include <cstdint>

namespace peakbound::cpu {

struct SigmoidRouting {
  std::int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// Throws InvalidArgument naming what does not fit (E, K and the groups).
void check_sigmoid_routing(std::int64_t E, std::int64_t K, const SigmoidRouting& r);

// logits [T, E] -> scores [T, E], ids [T, K] int32, weights [T, K], all WRITTEN. scores may
// alias logits (each row is read before it is written).
void moe_router_sigmoid_forward(float* scores, std::int32_t* ids, float* weights, const float* logits,
                                const float* bias, std::int64_t T, std::int64_t E, std::int64_t K,
                                const SigmoidRouting& r);

// Backward: dweights [T, K], the forward's scores [T, E] and ids [T, K] -> dlogits [T, E],
// WRITTEN (zero where no slot selected the expert: the selection and the bias are not
// differentiable, as in transformers, where the bias is a buffer). dlogits may alias scores.
// With c = routed_scaling_factor, s_k = scores[t, ids[t, k]], D = sum_k s_k + 1e-20:
//   ds_k = c dw_k                                     (no renormalization)
//        = c (dw_k D - sum_j dw_j s_j) / D^2          (norm_topk_prob)
//   dlogits[t, ids[t, k]] = ds_k s_k (1 - s_k)        (sigmoid), in double, stored in f32
void moe_router_sigmoid_backward(float* dlogits, const float* dweights, const float* scores,
                                 const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                                 const SigmoidRouting& r);

// Auxiliary-loss-free balancing, after a step: with load[e] the token-copies routed to e
// over the step (every rank's, every micro-batch's) and mean = sum load / E,
//   bias[e] += speed * sign(mean - load[e])   (an overloaded expert's bias falls, an
//                                              underloaded one's rises; equal: unchanged)
void moe_router_bias_update(float* bias, const float* load, std::int64_t E, float speed);

}  // namespace peakbound::cpu
