#include "peakbound/ops/moe_router.h"

#include "peakbound/kernels/cpu/moe_router.h"
#include "peakbound/kernels/cpu/moe_router_sigmoid.h"
#include "peakbound/kernels/cuda/moe_router.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void moe_router_forward(Device& dev, Stream& s, float* probs, std::int32_t* ids, float* weights, const float* logits,
                        std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  dispatch(dev, s, "moe_router_forward", {probs, ids, weights, logits},
           [&](void* stream) {
             cuda::moe_router_forward(stream, probs, ids, weights, logits, T, E, K, norm_topk_prob);
           },
           [=] { cpu::moe_router_forward(probs, ids, weights, logits, T, E, K, norm_topk_prob); });
}

void moe_router_stats(Device& dev, Stream& s, float* counts, float* prob_sums, const float* probs,
                      const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K) {
  dispatch(dev, s, "moe_router_stats", {counts, prob_sums, probs, ids},
           [&](void* stream) { cuda::moe_router_stats(stream, counts, prob_sums, probs, ids, T, E, K); },
           [=] { cpu::moe_router_stats(counts, prob_sums, probs, ids, T, E, K); });
}

void moe_aux_loss(Device& dev, Stream& s, float* loss, float* aux_grad, const float* counts, const float* prob_sums,
                  std::int64_t E, std::int64_t N, float coef) {
  dispatch(dev, s, "moe_aux_loss", {loss, aux_grad, counts, prob_sums},
           [&](void* stream) { cuda::moe_aux_loss(stream, loss, aux_grad, counts, prob_sums, E, N, coef); },
           [=] { cpu::moe_aux_loss(loss, aux_grad, counts, prob_sums, E, N, coef); });
}

void moe_router_backward(Device& dev, Stream& s, float* dlogits, const float* dweights, const float* probs,
                         const std::int32_t* ids, const float* aux_grad, std::int64_t T, std::int64_t E,
                         std::int64_t K, bool norm_topk_prob) {
  dispatch(dev, s, "moe_router_backward", {dlogits, dweights, probs, ids, aux_grad},
           [&](void* stream) {
             cuda::moe_router_backward(stream, dlogits, dweights, probs, ids, aux_grad, T, E, K, norm_topk_prob);
           },
           [=] { cpu::moe_router_backward(dlogits, dweights, probs, ids, aux_grad, T, E, K, norm_topk_prob); });
}

void moe_router_sigmoid_forward(Device& dev, Stream& s, float* scores, std::int32_t* ids, float* weights,
                                const float* logits, const float* correction, std::int64_t T, std::int64_t E,
                                std::int64_t K, const SigmoidRouting& r) {
  dispatch(dev, s, "moe_router_sigmoid_forward", {scores, ids, weights, logits, correction},
           [&](void*) { no_kernel(dev, "moe_router_sigmoid_forward"); },
           [=] { cpu::moe_router_sigmoid_forward(scores, ids, weights, logits, correction, T, E, K, r); });
}

void moe_router_sigmoid_backward(Device& dev, Stream& s, float* dlogits, const float* dweights, const float* scores,
                                 const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                                 const SigmoidRouting& r, const float* seq_w, std::int64_t seq_tokens) {
  dispatch(dev, s, "moe_router_sigmoid_backward", {dlogits, dweights, scores, ids, seq_w},
           [&](void*) { no_kernel(dev, "moe_router_sigmoid_backward"); },
           [=] { cpu::moe_router_sigmoid_backward(dlogits, dweights, scores, ids, T, E, K, r, seq_w, seq_tokens); });
}

void moe_router_seq_aux_weights(Device& dev, Stream& s, float* loss, float* seq_w, const float* counts,
                                const float* psum, std::int64_t B, std::int64_t E, std::int64_t K, std::int64_t S,
                                double coef, double scale) {
  dispatch(dev, s, "moe_router_seq_aux_weights", {loss, seq_w, counts, psum},
           [&](void*) { no_kernel(dev, "moe_router_seq_aux_weights"); },
           [=] {
             double sum = 0.0;
             cpu::moe_router_seq_aux_weights(&sum, seq_w, counts, psum, B, E, K, S, coef, scale);
             if (loss != nullptr) *loss = static_cast<float>(sum);
           });
}

void moe_router_seq_stats(Device& dev, Stream& s, float* counts, float* psum, const float* scores,
                          const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K,
                          std::int64_t seq_tokens) {
  dispatch(dev, s, "moe_router_seq_stats", {counts, psum, scores, ids},
           [&](void*) { no_kernel(dev, "moe_router_seq_stats"); },
           [=] { cpu::moe_router_seq_stats(counts, psum, scores, ids, T, E, K, seq_tokens); });
}

void moe_router_bias_update(Device& dev, Stream& s, float* correction, const float* load, std::int64_t E,
                            float speed) {
  dispatch(dev, s, "moe_router_bias_update", {correction, load},
           [&](void*) { no_kernel(dev, "moe_router_bias_update"); },
           [=] { cpu::moe_router_bias_update(correction, load, E, speed); });
}

}  // namespace peakbound::ops
