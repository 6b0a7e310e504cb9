// The MoE router (gate) of Qwen3-MoE and Mixtral, forward and backward, around
// MoeDispatch (schedules/moe_dispatch.h): it turns a layer's normed hidden states into
// the top-k expert ids and combine weights the dispatch takes, and the dispatch's
// d(weights) back into dx and dW_gate. Math: kernels/cpu/moe_router.h.
//
//   logits = x W_gate^T   (nn.Linear, no bias)  -> probs, ids, weights (top-k)
//
// Shapes (T tokens, possibly 0; H hidden; E experts; K top-k, 1 <= K <= E):
//   x          [T, H]  input, read
//   w_gate     [E, H]  weights, read
//   probs      [T, E]  forward writes softmax(logits); backward overwrites it with dlogits
//   ids        [T, K]  int32, forward writes
//   weights    [T, K]  forward writes (the combine weights MoeDispatch takes)
//   d_weights  [T, K]  backward reads (what MoeDispatch::backward writes)
//   counts     [E]     forward ADDS this layer's slot counts (null: skip)
//   prob_sums  [E]     forward ADDS this layer's sums of probs over tokens (null: skip)
//   aux_grad   [E]     backward reads (moe_aux_loss's gradient; null: no aux loss)
//   dw_gate    [E, H]  backward: ADDED into
//   dx         [T, H]  backward: written, or added into with accumulate_dx (the usual
//                      case: the dispatch's dx is already there); may alias x (x is
//                      last read by the dW_gate GEMM, before dx is first written)
//
// The aux loss, as transformers computes it: load_balancing_loss_func concatenates every
// MoE layer's router logits and computes ONE loss over all N = L x T rows; it is not a
// sum of per-layer losses. So a model zeroes one counts [E] and prob_sums [E] per step,
// lets every layer's forward add into them, then calls ops::moe_aux_loss(loss, aux_grad,
// counts, prob_sums, E, N = L x T, router_aux_loss_coef) once, and hands the same
// aux_grad to every layer's backward. A recompute forward (activation checkpointing)
// passes null counts and prob_sums so that nothing is counted twice.
//
// bf16 (mixed precision, docs/precision.md): x, w_gate and dx are bf16; the logits are
// one gemm_bf16 straight into the fp32 probs, and probs, weights, d_weights, counts,
// prob_sums, aux_grad and dw_gate stay fp32. The backward narrows dlogits once into
// d_logits16 [T, E] (bf16, caller's), the operand of dW_gate += d_logits16^T x (fp32,
// gemm_bf16 beta 1) and of dx (+)= d_logits16 W_gate (nn/linear: one rounding, through the
// caller's fp32 tile of linear_tile_spec(T, H)).
#pragma once

#include <cstdint>

#include "peakbound/core/buffer.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/model/model_config.h"

namespace peakbound {

struct MoeRouterShape {
  std::int64_t tokens = 0;
  std::int64_t hidden = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  bool norm_topk_prob = true;  // Qwen3-MoE's config field; true for Mixtral
  // DeepSeek-V3 / Kimi-K2 (scoring sigmoid): probs holds the sigmoid scores, the choice
  // adds the correction bias and is limited to the topk_group best of n_group groups,
  // the weights are the chosen scores (renormalised with norm_topk_prob) times
  // routed_scaling (kernels/cpu/moe_router_sigmoid.h). No aux loss (aux_grad must be null).
  RouterScoring scoring = RouterScoring::softmax;
  std::int64_t n_group = 1, topk_group = 1;
  float routed_scaling = 1.0f;
};

// Throws InvalidArgument naming the field for tokens < 0, hidden/experts < 1, top_k
// outside [1, experts], or (sigmoid) groups that do not fit the experts.
void check_moe_router_shape(const MoeRouterShape& s);

// One router's per-layer buffers (component c): probs [T, E] f32, ids [T, K] int32,
// weights [T, K] f32, d_weights [T, K] f32, and under bf16 d_logits16 [T, E] bf16 (the
// backward's narrowed dlogits; 0 bytes under f32).
struct MoeRouterBuffers {
  BufferSpec probs, ids, weights, d_weights;
  BufferSpec d_logits16{};
  std::uint64_t reserved() const {
    return probs.reserved() + ids.reserved() + weights.reserved() + d_weights.reserved() + d_logits16.reserved();
  }
};
MoeRouterBuffers moe_router_buffers(const MoeRouterShape& s, Component c = Component::layer);
MoeRouterBuffers moe_router_buffers(const MoeRouterShape& s, Precision p, Component c = Component::layer);

// The model's aux-loss buffers, one set for all layers (component c): counts [E],
// prob_sums [E], aux_grad [E], loss [1], all f32.
struct MoeAuxBuffers {
  BufferSpec counts, prob_sums, aux_grad, loss;
  std::uint64_t reserved() const {
    return counts.reserved() + prob_sums.reserved() + aux_grad.reserved() + loss.reserved();
  }
};
MoeAuxBuffers moe_aux_buffers(std::int64_t experts, Component c = Component::workspace);

// A MoeRouter and one set of aux buffers: phases "forward" and "backward", each
// holding both (the router keeps its buffers for its lifetime; backward allocates nothing).
Footprint moe_router_footprint(const MoeRouterShape& s);

// The free functions (caller-owned buffers).
// bias [E] (gpt-oss's router; null: none): logits = x W_gate^T + bias, in fp32; dbias [E]
// (f32) is then ADDED into with the column sums of dlogits.
// correction [E] f32 (sigmoid scoring's e_score_correction_bias; null: zeros): added to
// the scores for the choice only; no gradient reaches it (a buffer, moved between steps by
// ops::moe_router_bias_update).
void moe_router_forward(Device& dev, Stream& st, const MoeRouterShape& s, const float* x, const float* w_gate,
                        float* probs, std::int32_t* ids, float* weights, float* counts, float* prob_sums,
                        const float* bias = nullptr, const float* correction = nullptr);
// seq_w [T / seq_tokens, E] (sigmoid scoring only; null: none): DeepSeek-V3's sequence-wise
// balance loss's weights per local sequence of seq_tokens rows (ops::moe_router_sigmoid_backward).
void moe_router_backward(Device& dev, Stream& st, const MoeRouterShape& s, const float* x, const float* w_gate,
                         const float* d_weights, float* probs, const std::int32_t* ids, const float* aux_grad,
                         float* dw_gate, float* dx, bool accumulate_dx, float* dbias = nullptr,
                         const float* seq_w = nullptr, std::int64_t seq_tokens = 0);
// bf16 forms (see the top): d_logits16 [T, E] is written (scratch), tile is the fp32
// scratch of linear_tile_spec(T, H, Precision::bf16). dx may alias x, as in f32.
void moe_router_forward(Device& dev, Stream& st, const MoeRouterShape& s, const bf16* x, const bf16* w_gate,
                        float* probs, std::int32_t* ids, float* weights, float* counts, float* prob_sums,
                        const bf16* bias = nullptr, const float* correction = nullptr);
void moe_router_backward(Device& dev, Stream& st, const MoeRouterShape& s, const bf16* x, const bf16* w_gate,
                         const float* d_weights, float* probs, const std::int32_t* ids, const float* aux_grad,
                         float* dw_gate, bf16* dx, bool accumulate_dx, bf16* d_logits16, float* tile,
                         float* dbias = nullptr, const float* seq_w = nullptr, std::int64_t seq_tokens = 0);

// A router holding its buffers (from moe_router_buffers) across forward and backward,
// f32 (the MoE layer calls the free functions in either precision).
// After backward, probs() holds dlogits.
class MoeRouter {
 public:
  MoeRouter(Device& dev, MoeRouterShape shape);

  const MoeRouterShape& shape() const { return s_; }
  void forward(const float* x, const float* w_gate, float* counts, float* prob_sums);
  // Reads d_weights(), which the caller (MoeDispatch::backward) has filled.
  void backward(const float* x, const float* w_gate, const float* aux_grad, float* dw_gate, float* dx,
                bool accumulate_dx);

  const float* probs() const { return probs_.as<float>(); }
  const std::int32_t* ids() const { return ids_.as<std::int32_t>(); }
  const float* weights() const { return weights_.as<float>(); }
  float* d_weights() { return d_weights_.as<float>(); }

 private:
  Device& dev_;
  MoeRouterShape s_;
  Buffer probs_, ids_, weights_, d_weights_;
};

}  // namespace peakbound
