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
//
// With seq_w (non-null), the sequence-wise balance loss's term is added for every expert:
// token t belongs to local sequence b = t / seq_tokens, and with Z = sum_j s_j (every
// expert's score) and A = sum_j seq_w[b, j] s_j,
//   dlogits[t, i] += (seq_w[b, i] / Z - A / Z^2) s_i (1 - s_i)
// (moe_router_seq_aux_weights gives seq_w: d loss / d s'_i of the normalised scores).
void moe_router_sigmoid_backward(float* dlogits, const float* dweights, const float* scores,
                                 const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                                 const SigmoidRouting& r, const float* seq_w = nullptr,
                                 std::int64_t seq_tokens = 0);

// DeepSeek-V3's complementary sequence-wise balance loss (its report's eqs. 17-20), per MoE
// layer and sequence of S tokens, on the sigmoid scores s (without the bias) and the choice:
//   f_i = E / (K S) * #{t : i in ids[t]},   P_i = (1/S) sum_t s_ti / sum_j s_tj,
//   L   = alpha sum_i f_i P_i
// A rank may hold part of each sequence (context parallelism): its T rows are its
// T / seq_tokens local sequences of seq_tokens rows each, and the caller sums the statistics
// over the ranks sharing the sequences.
// Statistics: counts [T / seq_tokens, E] (the selections) and psum [T / seq_tokens, E] (the
// normalised scores' sums) ADDED INTO. seq_tokens >= 1 divides T.
void moe_router_seq_stats(float* counts, float* psum, const float* scores, const std::int32_t* ids, std::int64_t T,
                          std::int64_t E, std::int64_t K, std::int64_t seq_tokens);
// From the summed statistics of B sequences of S tokens each: loss (may be null) WRITTEN as
// sum over the B sequences of L (alpha = coef), and seq_w [B, E] WRITTEN as d (scale * that
// sum) / d s'_ti = scale * coef * f_i / S for a token of that sequence. seq_w may alias
// counts.
void moe_router_seq_aux_weights(double* loss, float* seq_w, const float* counts, const float* psum,
                                std::int64_t B, std::int64_t E, std::int64_t K, std::int64_t S, double coef,
                                double scale);

// Auxiliary-loss-free balancing, after a step: with load[e] the token-copies routed to e
// over the step (every rank's, every micro-batch's) and mean = sum load / E,
//   bias[e] += speed * sign(mean - load[e])   (an overloaded expert's bias falls, an
//                                              underloaded one's rises; equal: unchanged)
void moe_router_bias_update(float* bias, const float* load, std::int64_t E, float speed);

}  // namespace peakbound::cpu
