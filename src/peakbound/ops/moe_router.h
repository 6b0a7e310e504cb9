// The MoE router's kernels through the device's backend (see kernels/cpu/moe_router.h
// for the math, shapes and what is written or added into). The router's GEMMs are
// ops::gemm calls; layers/moe_router.h puts the two together.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"
#include "peakbound/kernels/cpu/moe_router_sigmoid.h"

namespace peakbound::ops {

// logits [T, E] -> probs [T, E], ids [T, K], weights [T, K], WRITTEN (probs may alias logits).
void moe_router_forward(Device& dev, Stream& s, float* probs, std::int32_t* ids, float* weights, const float* logits,
                        std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob);
// ADDS these tokens' slot counts and prob sums into counts [E] and prob_sums [E] (may be null).
void moe_router_stats(Device& dev, Stream& s, float* counts, float* prob_sums, const float* probs,
                      const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K);
// loss [1] (unscaled aux) and aux_grad [E] (coef-scaled d aux / d probs), WRITTEN; either may be null.
void moe_aux_loss(Device& dev, Stream& s, float* loss, float* aux_grad, const float* counts, const float* prob_sums,
                  std::int64_t E, std::int64_t N, float coef);
// dweights [T, K], probs [T, E], ids [T, K], aux_grad [E] or null -> dlogits [T, E],
// WRITTEN (may alias probs).
void moe_router_backward(Device& dev, Stream& s, float* dlogits, const float* dweights, const float* probs,
                         const std::int32_t* ids, const float* aux_grad, std::int64_t T, std::int64_t E,
                         std::int64_t K, bool norm_topk_prob);

// DeepSeek-V3's sigmoid group-limited router and its auxiliary-loss-free bias update
// (kernels/cpu/moe_router_sigmoid.h for the math; CPU kernels only: on CUDA they throw
// Unavailable naming the op). correction [E] (e_score_correction_bias) may be null.
using cpu::SigmoidRouting;
void moe_router_sigmoid_forward(Device& dev, Stream& s, float* scores, std::int32_t* ids, float* weights,
                                const float* logits, const float* correction, std::int64_t T, std::int64_t E,
                                std::int64_t K, const SigmoidRouting& r);
// seq_w [T / seq_tokens, E] or null: the sequence-wise balance loss's term (the kernel's).
void moe_router_sigmoid_backward(Device& dev, Stream& s, float* dlogits, const float* dweights, const float* scores,
                                 const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                                 const SigmoidRouting& r, const float* seq_w = nullptr,
                                 std::int64_t seq_tokens = 0);
// From the statistics of B sequences of S tokens: loss [1] f32 (may be null) WRITTEN as the
// sum of coef sum_i f_i P_i over them, seq_w [B, E] WRITTEN (may alias counts) as the
// backward's weights times scale (cpu::moe_router_seq_aux_weights).
void moe_router_seq_aux_weights(Device& dev, Stream& s, float* loss, float* seq_w, const float* counts,
                                const float* psum, std::int64_t B, std::int64_t E, std::int64_t K, std::int64_t S,
                                double coef, double scale);
// The sequence-wise balance loss's statistics [T / seq_tokens, E] each, ADDED INTO.
void moe_router_seq_stats(Device& dev, Stream& s, float* counts, float* psum, const float* scores,
                          const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                          std::int64_t seq_tokens);
void moe_router_bias_update(Device& dev, Stream& s, float* correction, const float* load, std::int64_t E,
                            float speed);

}  // namespace peakbound::ops
