#include "peakbound/layers/moe_router.h"

#include <string>

#include <type_traits>

#include "peakbound/core/error.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/moe_router.h"

namespace peakbound {

namespace {

ops::SigmoidRouting sigmoid_routing(const MoeRouterShape& s) {
  return {.n_group = s.n_group, .topk_group = s.topk_group, .norm_topk_prob = s.norm_topk_prob,
          .routed_scaling_factor = s.routed_scaling};
}

template <class A>
void router_forward(Device& dev, Stream& st, const MoeRouterShape& s, const A* x, const A* w_gate, float* probs,
                    std::int32_t* ids, float* weights, float* counts, float* prob_sums, const A* bias,
                    const float* correction) {
  check_moe_router_shape(s);
  PB_CHECK_MSG((counts == nullptr) == (prob_sums == nullptr), "moe router: counts and prob_sums go together");
  PB_CHECK_MSG(correction == nullptr || s.scoring == RouterScoring::sigmoid,
               "moe router: a correction bias needs sigmoid scoring");
  const std::int64_t T = s.tokens, H = s.hidden, E = s.experts, K = s.top_k;
  if (T == 0) return;
  ops::gemm(dev, st, false, true, T, E, H, 1.0f, x, H, w_gate, H, 0.0f, probs, E);  // logits = x W_gate^T (fp32)
  if (bias != nullptr) ops::add_bias(dev, st, probs, bias, T, E);                      // + bias (gpt-oss)
  if (s.scoring == RouterScoring::sigmoid)  // sigmoid scores in place
    ops::moe_router_sigmoid_forward(dev, st, probs, ids, weights, probs, correction, T, E, K, sigmoid_routing(s));
  else
    ops::moe_router_forward(dev, st, probs, ids, weights, probs, T, E, K, s.norm_topk_prob);  // softmax in place
  if (counts != nullptr) ops::moe_router_stats(dev, st, counts, prob_sums, probs, ids, T, E, K);
}

// f32: dlogits stay in probs and are the GEMMs' operand (d_logits16 and tile unused).
// bf16: dlogits are narrowed once into d_logits16, the operand of both products.
template <class A>
void router_backward(Device& dev, Stream& st, const MoeRouterShape& s, const A* x, const A* w_gate,
                     const float* d_weights, float* probs, const std::int32_t* ids, const float* aux_grad,
                     float* dw_gate, A* dx, bool accumulate_dx, A* d_logits16, float* tile, float* dbias,
                     const float* seq_w, std::int64_t seq_tokens) {
  check_moe_router_shape(s);
  const std::int64_t T = s.tokens, H = s.hidden, E = s.experts, K = s.top_k;
  if (T == 0) return;
  float* dlogits = probs;  // probs are read for the last time by the backward kernel
  if (s.scoring == RouterScoring::sigmoid) {
    PB_CHECK_MSG(aux_grad == nullptr, "moe router: sigmoid scoring takes no aux-loss gradient");
    ops::moe_router_sigmoid_backward(dev, st, dlogits, d_weights, probs, ids, T, E, K, sigmoid_routing(s), seq_w,
                                     seq_tokens);
  } else {
    PB_CHECK_MSG(seq_w == nullptr, "moe router: the sequence-wise balance loss needs sigmoid scoring");
    ops::moe_router_backward(dev, st, dlogits, d_weights, probs, ids, aux_grad, T, E, K, s.norm_topk_prob);
  }
  if (dbias != nullptr) ops::add_column_sums(dev, st, dbias, dlogits, T, E);
  const A* dl = nullptr;
  if constexpr (std::is_same_v<A, float>) {
    dl = dlogits;
  } else {
    PB_CHECK_MSG(d_logits16 != nullptr, "moe router: a bf16 backward needs d_logits16");
    ops::convert(dev, st, d_logits16, dlogits, T * E);
    dl = d_logits16;
  }
  ops::gemm(dev, st, true, false, E, H, T, 1.0f, dl, E, x, H, 1.0f, dw_gate, H);  // dW_gate += dlogits^T x
  // x is read for the last time above, so dx may alias it. dx (+)= dlogits W_gate.
  linear(dev, st, T, H, {{.a = dl, .lda = E, .b = w_gate, .ldb = H, .k = E, .trans_b = false}}, dx, H,
         accumulate_dx ? LinearMode::add : LinearMode::write, tile);
}

}  // namespace

void check_moe_router_shape(const MoeRouterShape& s) {
  if (s.tokens < 0) throw InvalidArgument("moe router: tokens must be >= 0, got " + std::to_string(s.tokens));
  if (s.hidden < 1) throw InvalidArgument("moe router: hidden must be >= 1, got " + std::to_string(s.hidden));
  if (s.experts < 1) throw InvalidArgument("moe router: experts must be >= 1, got " + std::to_string(s.experts));
  if (s.top_k < 1 || s.top_k > s.experts)
    throw InvalidArgument("moe router: top_k must be in [1, experts = " + std::to_string(s.experts) + "], got " +
                          std::to_string(s.top_k));
  if (s.scoring == RouterScoring::sigmoid) {
    try {
      cpu::check_sigmoid_routing(s.experts, s.top_k, sigmoid_routing(s));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("moe router: ") + e.what());
    }
  }
}

MoeRouterBuffers moe_router_buffers(const MoeRouterShape& s, Component c) {
  check_moe_router_shape(s);
  const auto T = static_cast<std::uint64_t>(s.tokens);
  const std::uint64_t te = checked_mul(T, static_cast<std::uint64_t>(s.experts), "moe router [T, E]");
  const std::uint64_t tk = checked_mul(T, static_cast<std::uint64_t>(s.top_k), "moe router [T, K]");
  return {buffer_spec(c, te, 4), buffer_spec(c, tk, 4), buffer_spec(c, tk, 4), buffer_spec(c, tk, 4),
          buffer_spec(c, 0, 2)};
}

MoeRouterBuffers moe_router_buffers(const MoeRouterShape& s, Precision p, Component c) {
  MoeRouterBuffers b = moe_router_buffers(s, c);
  if (p == Precision::bf16) b.d_logits16 = buffer_spec(c, b.probs.bytes / 4, dtype_size(DType::bf16));  // [T, E]
  return b;
}

MoeAuxBuffers moe_aux_buffers(std::int64_t experts, Component c) {
  if (experts < 1) throw InvalidArgument("moe aux loss: experts must be >= 1, got " + std::to_string(experts));
  const auto E = static_cast<std::uint64_t>(experts);
  return {buffer_spec(c, E, 4), buffer_spec(c, E, 4), buffer_spec(c, E, 4), buffer_spec(c, 1, 4)};
}

Footprint moe_router_footprint(const MoeRouterShape& s) {
  const MoeRouterBuffers r = moe_router_buffers(s);
  const MoeAuxBuffers a = moe_aux_buffers(s.experts);
  Footprint f("moe_router");
  for (const char* phase : {"forward", "backward"}) {
    for (const BufferSpec& b : {r.probs, r.ids, r.weights, r.d_weights}) f.device(phase, b);
    for (const BufferSpec& b : {a.counts, a.prob_sums, a.aux_grad, a.loss}) f.device(phase, b);
  }
  return f;
}

void moe_router_forward(Device& dev, Stream& st, const MoeRouterShape& s, const float* x, const float* w_gate,
                        float* probs, std::int32_t* ids, float* weights, float* counts, float* prob_sums,
                        const float* bias, const float* correction) {
  router_forward(dev, st, s, x, w_gate, probs, ids, weights, counts, prob_sums, bias, correction);
}

void moe_router_forward(Device& dev, Stream& st, const MoeRouterShape& s, const bf16* x, const bf16* w_gate,
                        float* probs, std::int32_t* ids, float* weights, float* counts, float* prob_sums,
                        const bf16* bias, const float* correction) {
  router_forward(dev, st, s, x, w_gate, probs, ids, weights, counts, prob_sums, bias, correction);
}

void moe_router_backward(Device& dev, Stream& st, const MoeRouterShape& s, const float* x, const float* w_gate,
                         const float* d_weights, float* probs, const std::int32_t* ids, const float* aux_grad,
                         float* dw_gate, float* dx, bool accumulate_dx, float* dbias, const float* seq_w,
                         std::int64_t seq_tokens) {
  router_backward<float>(dev, st, s, x, w_gate, d_weights, probs, ids, aux_grad, dw_gate, dx, accumulate_dx, nullptr,
                         nullptr, dbias, seq_w, seq_tokens);
}

void moe_router_backward(Device& dev, Stream& st, const MoeRouterShape& s, const bf16* x, const bf16* w_gate,
                         const float* d_weights, float* probs, const std::int32_t* ids, const float* aux_grad,
                         float* dw_gate, bf16* dx, bool accumulate_dx, bf16* d_logits16, float* tile,
                         float* dbias, const float* seq_w, std::int64_t seq_tokens) {
  router_backward<bf16>(dev, st, s, x, w_gate, d_weights, probs, ids, aux_grad, dw_gate, dx, accumulate_dx,
                        d_logits16, tile, dbias, seq_w, seq_tokens);
}

MoeRouter::MoeRouter(Device& dev, MoeRouterShape shape) : dev_(dev), s_(shape) {
  const MoeRouterBuffers b = moe_router_buffers(s_);
  probs_ = dev.allocate(b.probs.component, b.probs.bytes);
  ids_ = dev.allocate(b.ids.component, b.ids.bytes);
  weights_ = dev.allocate(b.weights.component, b.weights.bytes);
  d_weights_ = dev.allocate(b.d_weights.component, b.d_weights.bytes);
}

void MoeRouter::forward(const float* x, const float* w_gate, float* counts, float* prob_sums) {
  moe_router_forward(dev_, dev_.compute_stream(), s_, x, w_gate, probs_.as<float>(), ids_.as<std::int32_t>(),
                     weights_.as<float>(), counts, prob_sums);
}

void MoeRouter::backward(const float* x, const float* w_gate, const float* aux_grad, float* dw_gate, float* dx,
                         bool accumulate_dx) {
  moe_router_backward(dev_, dev_.compute_stream(), s_, x, w_gate, d_weights_.as<float>(), probs_.as<float>(),
                      ids_.as<std::int32_t>(), aux_grad, dw_gate, dx, accumulate_dx);
}

}  // namespace peakbound
