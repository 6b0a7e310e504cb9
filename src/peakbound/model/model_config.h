// The shape of a decoder-only Mixture-of-Experts transformer: every size that
// decides which tensors exist and how large they are. Presets and the Hugging
// Face importer produce one; the parameter counter and the memory planner read it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/model/rope_scaling.h"

namespace peakbound {

// GQA covers MHA (kv heads == heads) and MQA (one kv head). MLA is DeepSeek's
// multi-head latent attention, where K and V come from a compressed latent.
enum class AttentionKind : std::uint8_t { gqa, mla };

// How router logits become expert weights: softmax over all experts
// (Mixtral, Qwen, gpt-oss) or an independent sigmoid per expert (DeepSeek-V3).
enum class RouterScoring : std::uint8_t { softmax, sigmoid };

std::string_view attention_kind_name(AttentionKind k);
std::string_view router_scoring_name(RouterScoring s);

// One model. Sizes are element counts (not bytes). A field that a family does not
// use stays 0/false. Layer placement: layer i has a routed-expert MLP when
// num_experts > 0, i >= num_dense_layers, (i + 1) % moe_layer_step == 0 (Qwen's
// decoder_sparse_step convention) and i is not in mlp_only_layers; every other
// layer has a dense MLP of dense_intermediate_size.
struct ModelConfig {
  // Layer counts are bounded (layout queries and importers walk the layers one by one).
  static constexpr std::int64_t kMaxLayers = std::int64_t{1} << 16;

  std::string name;    // preset name or the imported checkpoint's folder name
  std::string family;  // Hugging Face model_type ("deepseek_v3") or "peakbound"

  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t max_position_embeddings = 0;  // informational; 0 = not stated

  // Layer layout and dense MLP.
  std::int64_t num_dense_layers = 0;  // leading dense layers (DeepSeek first_k_dense_replace)
  std::int64_t moe_layer_step = 1;    // Qwen decoder_sparse_step
  // Qwen mlp_only_layers: forced dense. Increasing, no repeats (validate checks; layer
  // queries binary-search it, so walking the layers stays linear).
  std::vector<std::int64_t> mlp_only_layers;
  std::int64_t dense_intermediate_size = 0;

  // Mixture of experts. num_experts == 0 means a dense model.
  std::int64_t num_experts = 0;            // routed experts per MoE layer
  std::int64_t top_k = 0;                  // routed experts each token visits
  std::int64_t moe_intermediate_size = 0;  // width of one routed expert
  std::int64_t num_shared_experts = 0;     // always-on experts per MoE layer
  // Width of each shared expert; 0 means moe_intermediate_size (DeepSeek's
  // convention). Qwen2-MoE's one shared expert is wider than a routed one.
  std::int64_t shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;  // Qwen2-MoE: sigmoid gate [1, H] on the shared expert
  RouterScoring router_scoring = RouterScoring::softmax;
  bool norm_topk_prob = false;       // renormalise the top-k weights to sum to 1
  bool router_bias = false;          // gpt-oss: the router Linear has a bias [E]
  bool router_score_correction = false;  // DeepSeek-V3 e_score_correction_bias [E]
  // DeepSeek-V3's group-limited routing (sigmoid scoring): the experts form n_group equal
  // groups and each token chooses among the topk_group best (n_group, topk_group); the
  // routed experts' weights are multiplied by routed_scaling_factor. 1, 1, 1.0: no limit,
  // no scaling.
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool mlp_bias = false;  // every MLP (dense, routed, shared) has biases (gpt-oss experts)
  // gpt-oss's clamped SwiGLU in the routed experts (swiglu_limit, swiglu_alpha): 0 means
  // the plain silu(gate) * up.
  double swiglu_limit = 0.0;
  double swiglu_alpha = 1.702;

  // Attention.
  AttentionKind attention = AttentionKind::gqa;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // MLA: equals num_heads (K/V are per head after up-projection)
  std::int64_t head_dim = 0;      // GQA only; MLA uses the dims below
  bool attention_qkv_bias = false;  // MLA: biases on q_a_proj and kv_a_proj_with_mqa
  bool attention_out_bias = false;  // o_proj bias (gpt-oss, Llama attention_bias)
  bool attention_sinks = false;     // gpt-oss: one learned sink logit per head
  bool qk_norm = false;             // Qwen3: RMSNorm over each q and k head [head_dim]

  // MLA (attention == mla). q_lora_rank 0 means queries are not compressed.
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
  // DeepSeek lays the rope dimensions out in interleaved pairs (rope_interleave, default
  // true in transformers' DeepseekV3Config).
  bool rope_interleave = false;
  // The attention's softmax scale is qk_head_dim^-0.5 times this: DeepSeek's YaRN
  // (yarn_apply_mscale) makes it get_mscale(factor, mscale_all_dim)^2 under MLA; else 1.
  double attention_softmax_factor = 1.0;

  // RoPE base (Hugging Face rope_theta): inv_freq[i] = rope_theta^(-2i / rotary dim).
  // The plain ("default") rotary embedding and YaRN (rope_type "yarn": rope_scaling,
  // model/rope_scaling.h) are modelled; another scaled one (linear, dynamic, llama3,
  // longrope) is recorded in `unmodelled` below.
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  // Settings of an imported config.json that change what the model computes without
  // changing its shape, and that the trainer does not implement: each one line naming the
  // field, its value and what is implemented ("hidden_act = \"gelu\": the trainer implements
  // SiLU (\"silu\") only"). A value equal to the implemented behaviour, or null, is not
  // listed. Planning and parameter counts ignore them; check_trainable refuses a model with
  // any, so a run never trains a different model than its config.json describes.
  std::vector<std::string> unmodelled;

  // RMSNorm epsilon (rms_norm_eps), every norm of the model.
  double rms_norm_eps = 1e-6;
  // Coefficient of the router's load-balancing loss in the training loss: the config's
  // router_aux_loss_coef when output_router_logits is true (transformers adds the loss
  // only then), else 0.
  double router_aux_loss_coef = 0.0;
  // DeepSeek-V3's complementary sequence-wise balance loss (its report's alpha; sigmoid
  // routers only): alpha sum_i f_i P_i per MoE layer and sequence, added to the loss as the
  // mean over the step's sequences, summed over the layers. Not a config.json field
  // (transformers has no such loss): train's --seq-aux-coef. 0: off.
  double seq_aux_loss_coef = 0.0;
  // Under context parallelism MLA's ring circulates the latent and the rotated rope key
  // (kv_lora_rank + qk_rope_head_dim per token, expanded through kv_b_proj at each hop)
  // instead of every head's K and V: 71x fewer bytes for DeepSeek-V3. Not a config.json
  // field: train's --cp-ring (latent or kv).
  bool mla_latent_ring = true;
  // Under context parallelism the attention of the K/V form runs as Ulysses (the heads
  // split over the group by all-to-all, schedules/ulysses_attention.h; cp must divide
  // num_key_value_heads) instead of the ring. Not a config.json field: train's
  // --context-attention (ring or ulysses). MLA keeps its ring.
  bool ulysses_attention = false;
  // Standard deviation of the normal initialisation of every Linear and the
  // embedding (initializer_range); RMSNorm weights start at 1.
  double initializer_range = 0.02;

  bool tie_word_embeddings = false;
  // DeepSeek multi-token-prediction modules (num_nextn_predict_layers); counted
  // apart from the headline total, as DeepSeek reports it.
  std::int64_t num_mtp_layers = 0;

  // Sliding-window attention: the window in keys (transformers' sliding_window: a query
  // sees itself and the window - 1 keys before it) and the layers that use it, increasing
  // without repeats (gpt-oss: 128 on layers 0, 2, 4, ...; Mixtral: every layer when set);
  // num_sliding_layers is their count. The other layers attend to the whole causal prefix.
  std::int64_t sliding_window = 0;
  std::int64_t num_sliding_layers = 0;
  std::vector<std::int64_t> sliding_layers;

  bool is_moe_layer(std::int64_t layer) const;
  // The attention window of a layer: sliding_window for a sliding layer, else 0 (none).
  std::int64_t attention_window(std::int64_t layer) const;
  // Sets sliding_layers (and num_sliding_layers) to the layers where slides(i) holds.
  template <class Pred>
  void set_sliding_layers(Pred slides) {
    sliding_layers.clear();
    for (std::int64_t i = 0; i < num_layers; ++i)
      if (slides(i)) sliding_layers.push_back(i);
    num_sliding_layers = static_cast<std::int64_t>(sliding_layers.size());
  }
  std::int64_t num_moe_layers() const;
  // Per-head width of queries and keys: head_dim, or nope + rope under MLA.
  std::int64_t qk_head_dim() const;
  // Per-head width of values: head_dim, or v_head_dim under MLA.
  std::int64_t value_head_dim() const;
  // The shared experts are stored as one MLP of width num_shared_experts x the shared
  // width (DeepSeek's families: deepseek_v2, deepseek_v3, kimi_k2, dots1).
  bool merged_shared_experts() const;
  // Width of one shared expert after applying the 0 = moe_intermediate_size rule.
  std::int64_t shared_expert_width() const;

  // Throws InvalidArgument naming the first impossible value.
  void validate() const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace peakbound
