#include "peakbound/ops/moe_router.h"

#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cpu/moe_router.h"
#include "peakbound/kernels/cuda/moe_router.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void moe_router_forward(Device& dev, Stream& s, float* probs, std::int32_t* ids, float* weights, const float* logits,
                        std::int64_t T, std::int64_t E, std::int64_t K, bool norm_topk_prob) {
  check_device_pointers(dev, "moe_router_forward", {probs, ids, weights, logits});
  PB_ON_CUDA(dev, s, cuda::moe_router_forward(stream, probs, ids, weights, logits, T, E, K, norm_topk_prob))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_router_forward");
  cpu::launch(s, [=] { cpu::moe_router_forward(probs, ids, weights, logits, T, E, K, norm_topk_prob); });
}

void moe_router_stats(Device& dev, Stream& s, float* counts, float* prob_sums, const float* probs,
                      const std::int32_t* ids, std::int64_t T, std::int64_t E, std::int64_t K) {
  check_device_pointers(dev, "moe_router_stats", {counts, prob_sums, probs, ids});
  PB_ON_CUDA(dev, s, cuda::moe_router_stats(stream, counts, prob_sums, probs, ids, T, E, K))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_router_stats");
  cpu::launch(s, [=] { cpu::moe_router_stats(counts, prob_sums, probs, ids, T, E, K); });
}

void moe_aux_loss(Device& dev, Stream& s, float* loss, float* aux_grad, const float* counts, const float* prob_sums,
                  std::int64_t E, std::int64_t N, float coef) {
  check_device_pointers(dev, "moe_aux_loss", {loss, aux_grad, counts, prob_sums});
  PB_ON_CUDA(dev, s, cuda::moe_aux_loss(stream, loss, aux_grad, counts, prob_sums, E, N, coef))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_aux_loss");
  cpu::launch(s, [=] { cpu::moe_aux_loss(loss, aux_grad, counts, prob_sums, E, N, coef); });
}

void moe_router_backward(Device& dev, Stream& s, float* dlogits, const float* dweights, const float* probs,
                         const std::int32_t* ids, const float* aux_grad, std::int64_t T, std::int64_t E,
                         std::int64_t K, bool norm_topk_prob) {
  check_device_pointers(dev, "moe_router_backward", {dlogits, dweights, probs, ids, aux_grad});
  PB_ON_CUDA(dev, s, cuda::moe_router_backward(stream, dlogits, dweights, probs, ids, aux_grad, T, E, K, norm_topk_prob))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_router_backward");
  cpu::launch(s, [=] { cpu::moe_router_backward(dlogits, dweights, probs, ids, aux_grad, T, E, K, norm_topk_prob); });
}

}  // namespace peakbound::ops
