#include "peakbound/model/describe.h"

#include <cstdio>

namespace peakbound {

nlohmann::json to_json(const ModelConfig& c) {
  nlohmann::json j;
  j["name"] = c.name;
  j["family"] = c.family;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_layers"] = c.num_layers;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["num_dense_layers"] = c.num_dense_layers;
  j["moe_layer_step"] = c.moe_layer_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["num_moe_layers"] = c.num_moe_layers();
  j["dense_intermediate_size"] = c.dense_intermediate_size;
  j["num_experts"] = c.num_experts;
  j["top_k"] = c.top_k;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_shared_experts"] = c.num_shared_experts;
  j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["shared_expert_gate"] = c.shared_expert_gate;
  j["router_scoring"] = std::string(router_scoring_name(c.router_scoring));
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["router_bias"] = c.router_bias;
  j["router_score_correction"] = c.router_score_correction;
  j["mlp_bias"] = c.mlp_bias;
  j["attention"] = std::string(attention_kind_name(c.attention));
  j["num_heads"] = c.num_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["attention_qkv_bias"] = c.attention_qkv_bias;
  j["attention_out_bias"] = c.attention_out_bias;
  j["attention_sinks"] = c.attention_sinks;
  j["qk_norm"] = c.qk_norm;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["num_mtp_layers"] = c.num_mtp_layers;
  j["sliding_window"] = c.sliding_window;
  j["num_sliding_layers"] = c.num_sliding_layers;
  return j;
}

nlohmann::json to_json(const ParamCount& p) {
  return {
      {"embedding", p.embedding},
      {"lm_head", p.lm_head},
      {"attention", p.attention},
      {"dense_mlp", p.dense_mlp},
      {"routed_experts", p.routed_experts},
      {"shared_experts", p.shared_experts},
      {"router", p.router},
      {"norms", p.norms},
      {"total", p.total},
      {"active", p.active},
      {"active_non_embedding", p.active_non_embedding},
      {"mtp", p.mtp},
      {"mtp_checkpoint_copies", p.mtp_checkpoint_copies},
      {"num_dense_layers", p.num_dense_layers},
      {"num_moe_layers", p.num_moe_layers},
      {"routed_expert", p.routed_expert},
      {"attention_per_layer", p.attention_per_layer},
      {"dense_layer", p.dense_layer},
      {"moe_layer_non_expert", p.moe_layer_non_expert},
      {"moe_layer", p.moe_layer},
  };
}

std::string format_params(std::int64_t n) {
  struct Unit {
    double scale;
    const char* suffix;
  };
  static constexpr Unit units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
  const double v = static_cast<double>(n);
  char buf[64];
  for (const Unit& u : units) {
    if (v >= u.scale) {
      std::snprintf(buf, sizeof buf, "%.2f%s", v / u.scale, u.suffix);
      return buf;
    }
  }
  return std::to_string(n);
}

std::string summary(const ModelConfig& c) {
  const ParamCount p = count_params(c);  // validates
  std::string s = c.name + " (" + c.family + "): " + std::to_string(c.num_layers) + " layers";
  if (c.num_experts > 0)
    s += " (" + std::to_string(p.num_dense_layers) + " dense, " + std::to_string(p.num_moe_layers) +
         " MoE)";
  s += ", hidden " + std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size);
  if (c.attention == AttentionKind::mla)
    s += ", MLA " + std::to_string(c.num_heads) + " heads";
  else
    s += ", GQA " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) +
         " heads x " + std::to_string(c.head_dim);
  if (c.num_experts > 0) {
    s += ", " + std::to_string(c.num_experts) + " experts top-" + std::to_string(c.top_k);
    if (c.num_shared_experts > 0) s += " + " + std::to_string(c.num_shared_experts) + " shared";
  }
  s += "; " + format_params(p.total) + " params, " + format_params(p.active) + " active";
  if (p.mtp > 0) s += " (+" + format_params(p.mtp) + " MTP)";
  return s;
}

}  // namespace peakbound
