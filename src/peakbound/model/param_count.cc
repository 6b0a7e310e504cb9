#include "peakbound/model/param_count.h"

#include <initializer_list>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

// Sizes are validated to be <= 2^30 each, but products over layers and experts of
// an absurd config can still pass 2^63: check every step rather than wrap.
class Counter {
 public:
  explicit Counter(const std::string& name) : name_(name) {}

  std::int64_t mul(std::initializer_list<std::int64_t> factors) const {
    std::int64_t r = 1;
    for (std::int64_t f : factors)
      if (__builtin_mul_overflow(r, f, &r)) overflow();
    return r;
  }
  std::int64_t add(std::initializer_list<std::int64_t> terms) const {
    std::int64_t r = 0;
    for (std::int64_t t : terms)
      if (__builtin_add_overflow(r, t, &r)) overflow();
    return r;
  }

 private:
  [[noreturn]] void overflow() const {
    throw InvalidArgument("model '" + name_ + "': parameter count overflows 64 bits");
  }
  std::string name_;
};

// A bias-optional Linear: in -> out.
std::int64_t linear(const Counter& n, std::int64_t in, std::int64_t out, bool bias) {
  return n.add({n.mul({in, out}), bias ? out : 0});
}

// A gated (SwiGLU) MLP: gate and up [I, H], down [H, I].
std::int64_t gated_mlp(const Counter& n, std::int64_t hidden, std::int64_t width, bool bias) {
  return n.add({linear(n, hidden, width, bias), linear(n, hidden, width, bias),
                linear(n, width, hidden, bias)});
}

std::int64_t gqa_attention(const Counter& n, const ModelConfig& c) {
  const std::int64_t q = c.num_heads * c.head_dim;
  const std::int64_t kv = c.num_kv_heads * c.head_dim;
  return n.add({linear(n, c.hidden_size, q, c.attention_qkv_bias),
                linear(n, c.hidden_size, kv, c.attention_qkv_bias),
                linear(n, c.hidden_size, kv, c.attention_qkv_bias),
                linear(n, q, c.hidden_size, c.attention_out_bias),
                c.qk_norm ? 2 * c.head_dim : 0,  // q_norm, k_norm [head_dim]
                c.attention_sinks ? c.num_heads : 0});
}

// DeepSeek-V2/V3 MLA. As in the reference code, only q_a_proj, kv_a_proj_with_mqa
// and o_proj take attention_bias; q_b_proj, kv_b_proj and a plain q_proj do not.
std::int64_t mla_attention(const Counter& n, const ModelConfig& c) {
  const std::int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  std::int64_t q;
  if (c.q_lora_rank > 0) {
    q = n.add({linear(n, c.hidden_size, c.q_lora_rank, c.attention_qkv_bias),  // q_a_proj
               c.q_lora_rank,                                                   // q_a_layernorm
               linear(n, c.q_lora_rank, c.num_heads * qk, false)});             // q_b_proj
  } else {
    q = linear(n, c.hidden_size, c.num_heads * qk, false);  // q_proj
  }
  const std::int64_t kv = n.add(
      {linear(n, c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, c.attention_qkv_bias),
       c.kv_lora_rank,  // kv_a_layernorm
       linear(n, c.kv_lora_rank, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), false)});
  const std::int64_t o = linear(n, c.num_heads * c.v_head_dim, c.hidden_size, c.attention_out_bias);
  return n.add({q, kv, o, c.attention_sinks ? c.num_heads : 0});
}

}  // namespace

ParamCount count_params(const ModelConfig& c) {
  c.validate();
  const Counter n(c.name);
  const std::int64_t H = c.hidden_size;
  ParamCount p;

  p.num_moe_layers = c.num_moe_layers();
  p.num_dense_layers = c.num_layers - p.num_moe_layers;

  p.attention_per_layer = c.attention == AttentionKind::mla ? mla_attention(n, c)
                                                            : gqa_attention(n, c);
  const std::int64_t layer_norms = 2 * H;  // input_layernorm, post_attention_layernorm
  std::int64_t dense_mlp = 0;
  if (p.num_dense_layers > 0) {
    dense_mlp = gated_mlp(n, H, c.dense_intermediate_size, c.mlp_bias);
    p.dense_layer = n.add({p.attention_per_layer, dense_mlp, layer_norms});
  }

  std::int64_t router = 0, shared = 0;
  if (c.num_experts > 0) {
    p.routed_expert = gated_mlp(n, H, c.moe_intermediate_size, c.mlp_bias);
    router = n.add({n.mul({c.num_experts, H}), c.router_bias ? c.num_experts : 0,
                    c.router_score_correction ? c.num_experts : 0});
    const std::int64_t one_shared = gated_mlp(n, H, c.shared_expert_width(), c.mlp_bias);
    shared = n.add({n.mul({c.num_shared_experts, one_shared}), c.shared_expert_gate ? H : 0});
    p.moe_layer_non_expert = n.add({p.attention_per_layer, layer_norms, router, shared});
    p.moe_layer = n.add({p.moe_layer_non_expert, n.mul({c.num_experts, p.routed_expert})});
  }

  p.embedding = n.mul({c.vocab_size, H});
  p.lm_head = c.tie_word_embeddings ? 0 : p.embedding;
  p.attention = n.mul({c.num_layers, p.attention_per_layer});
  p.dense_mlp = n.mul({p.num_dense_layers, dense_mlp});
  p.routed_experts = n.mul({p.num_moe_layers, c.num_experts, p.routed_expert});
  p.shared_experts = n.mul({p.num_moe_layers, shared});
  p.router = n.mul({p.num_moe_layers, router});
  p.norms = n.add({n.mul({c.num_layers, layer_norms}), H});  // + final norm
  p.total = n.add({p.embedding, p.lm_head, p.attention, p.dense_mlp, p.routed_experts,
                   p.shared_experts, p.router, p.norms});

  const std::int64_t unvisited =
      n.mul({p.num_moe_layers, c.num_experts - c.top_k, p.routed_expert});
  p.active = p.total - unvisited;
  p.active_non_embedding = p.active - p.embedding;

  if (c.num_mtp_layers > 0) {
    // One MTP module: enorm, hnorm [H]; eh_proj [H, 2H]; a decoder layer (MoE when
    // the model has experts, as DeepSeek's layer 61 is); shared_head.norm [H].
    const std::int64_t block = c.num_experts > 0 ? p.moe_layer : p.dense_layer;
    const std::int64_t per_module = n.add({2 * H, n.mul({2 * H, H}), block, H});
    p.mtp = n.mul({c.num_mtp_layers, per_module});
    p.mtp_checkpoint_copies = n.mul({c.num_mtp_layers, n.add({p.embedding, p.lm_head})});
  }
  return p;
}

}  // namespace peakbound
