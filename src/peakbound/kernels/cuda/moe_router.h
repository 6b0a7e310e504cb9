// The CUDA backend's MoE router kernels, llm.c style, launched on `stream` (a
// cudaStream_t): the math, tie order, and what is written or added into are the CPU
// kernels' (kernels/cpu/moe_router.h). One thread per token for the forward and
// backward (E is tens to hundreds, K a handful: a token's row is one thread's work, as
// on the CPU, in the same double accumulations); the statistics are one thread per
// expert over the tokens in order (deterministic). K is at most kMaxTopK here.
#pragma once

#include <cstdint>

namespace peakbound::cuda {

inline constexpr std::int64_t kMaxTopK = 64;

void moe_router_forward(void* stream, float* probs, std::int32_t* ids, float* weights, const float* logits,
                        std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob);
void moe_router_stats(void* stream, float* counts, float* prob_sums, const float* probs, const std::int32_t* ids,
                      std::int64_t T, std::int64_t E, std::int64_t K);
void moe_aux_loss(void* stream, float* loss, float* aux_grad, const float* counts, const float* prob_sums,
                  std::int64_t E, std::int64_t N, float coef);
void moe_router_backward(void* stream, float* dlogits, const float* dweights, const float* probs,
                         const std::int32_t* ids, const float* aux_grad, std::int64_t T, std::int64_t E,
                         std::int64_t K, bool norm_topk_prob);

}  // namespace peakbound::cuda
