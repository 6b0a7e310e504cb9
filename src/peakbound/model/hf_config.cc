#include "peakbound/model/hf_config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "peakbound/core/error.h"
#include "peakbound/model/hf_fields.h"

namespace peakbound {

namespace {

using nlohmann::json;

// A list of layer indices read as the set transformers tests membership in ("i in
// mlp_only_layers"): sorted, repeats dropped, as ModelConfig keeps it.
std::vector<std::int64_t> layer_set(const HfFields& r, const char* key) {
  std::vector<std::int64_t> v = r.int_list_or_empty(key);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Fields every decoder-only family names alike.
void read_common(const HfFields& r, ModelConfig& c) {
  c.family = r.model_type().empty() ? "unknown" : r.model_type();
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.num_layers = r.integer("num_hidden_layers");
  // Checked before anything walks the layers (a config with 1e15 layers must be refused
  // at once, not after a loop over them).
  if (c.num_layers > ModelConfig::kMaxLayers)
    r.fail("num_hidden_layers = " + std::to_string(c.num_layers) + " is implausibly large (max " +
           std::to_string(ModelConfig::kMaxLayers) + ")");
  c.num_heads = r.integer("num_attention_heads");
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 0);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
}

void read_gqa(const HfFields& r, ModelConfig& c, bool head_dim_required) {
  c.attention = AttentionKind::gqa;
  c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);  // absent = MHA
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
  } else if (head_dim_required) {
    r.missing("head_dim");
  } else if (c.num_heads > 0 && c.hidden_size % c.num_heads == 0) {
    c.head_dim = c.hidden_size / c.num_heads;
  } else {
    r.fail("missing field 'head_dim': hidden_size " + std::to_string(c.hidden_size) +
           " is not a multiple of num_attention_heads " + std::to_string(c.num_heads));
  }
}

// The window and the layers that use it, as transformers 5.24 builds each family's masks:
// layer_types when the config lists them (every family that has them saves them); without,
// gpt-oss alternates from layer 0, Qwen2-MoE slides the even layers below
// max_window_layers, Qwen2 / Qwen3 the layers from max_window_layers on, and Qwen3-MoE and
// the Mistral-style families (Mixtral) every layer. The Qwen families gate the window with
// use_sliding_window (false when absent, as their configs default it).
void read_sliding_window(const HfFields& r, ModelConfig& c) {
  const std::string& t = r.model_type();
  const bool qwen = t == "qwen3_moe" || t == "qwen2_moe" || t == "qwen3" || t == "qwen2";
  if (!r.has("sliding_window") || !r.boolean_or("use_sliding_window", !qwen)) return;
  c.sliding_window = r.integer("sliding_window");
  if (c.sliding_window == 0) return;
  const std::int64_t max_window = r.integer_or("max_window_layers", 0);
  if (r.has("layer_types")) {
    const std::vector<std::string> types = r.string_list_or_empty("layer_types");
    if (static_cast<std::int64_t>(types.size()) != c.num_layers)
      r.fail("field 'layer_types' has " + std::to_string(types.size()) +
             " entries but num_hidden_layers is " + std::to_string(c.num_layers));
    for (const std::string& type : types)
      if (type != "sliding_attention" && type != "full_attention")
        r.fail("field 'layer_types' has \"" + type + "\"; known: \"sliding_attention\", \"full_attention\"");
    c.set_sliding_layers([&](std::int64_t i) { return types[static_cast<std::size_t>(i)] == "sliding_attention"; });
  } else if (t == "gpt_oss") {
    c.set_sliding_layers([](std::int64_t i) { return i % 2 == 0; });
  } else if (t == "qwen2_moe") {
    c.set_sliding_layers([&](std::int64_t i) { return i % 2 == 0 && i < max_window; });
  } else if (t == "qwen2" || t == "qwen3" || t == "dots1") {
    c.set_sliding_layers([&](std::int64_t i) { return i >= max_window; });
  } else {
    c.set_sliding_layers([](std::int64_t) { return true; });
  }
}

// intermediate_size is the dense MLP width: required once any layer is dense,
// kept when present so the imported config round-trips the file.
void read_dense_width(const HfFields& r, ModelConfig& c) {
  if (c.num_moe_layers() < c.num_layers)
    c.dense_intermediate_size = r.integer("intermediate_size");
  else
    c.dense_intermediate_size = r.integer_or("intermediate_size", 0);
}

RouterScoring read_scoring(const HfFields& r, RouterScoring fallback) {
  const std::string s = r.string_or("scoring_func", std::string(router_scoring_name(fallback)));
  if (s == "softmax") return RouterScoring::softmax;
  if (s == "sigmoid") return RouterScoring::sigmoid;
  r.fail("field 'scoring_func' must be \"softmax\" or \"sigmoid\", got \"" + s + "\"");
}

// DeepSeek-V2/V3 (and MLA configs of unknown type). V3's defaults: sigmoid
// scoring, renormalised top-k, noaux_tc routing with a score-correction bias.
void read_deepseek(const HfFields& r, ModelConfig& c, bool v3_defaults) {
  c.attention = AttentionKind::mla;
  c.num_kv_heads = c.num_heads;
  if (!r.present("q_lora_rank")) r.missing("q_lora_rank");  // null = uncompressed queries
  c.q_lora_rank = r.integer_or("q_lora_rank", 0);
  c.kv_lora_rank = r.integer("kv_lora_rank");
  c.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  c.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  c.v_head_dim = r.integer("v_head_dim");
  const bool bias = r.boolean_or("attention_bias", false);
  c.attention_qkv_bias = bias;
  c.attention_out_bias = bias;
  c.rope_interleave = r.boolean_or("rope_interleave", true);

  c.num_experts = r.integer("n_routed_experts");
  if (c.num_experts > 0) {
    c.top_k = r.integer("num_experts_per_tok");
    c.moe_intermediate_size = r.integer("moe_intermediate_size");
    c.num_shared_experts = r.integer("n_shared_experts");
    c.num_dense_layers = r.integer("first_k_dense_replace");
    // DeepSeek puts an MoE at i >= first_k_dense_replace when i % moe_layer_freq
    // == 0; ModelConfig expresses the other layers as forced-dense ones.
    const std::int64_t freq = r.integer_or("moe_layer_freq", 1);
    if (freq == 0) r.fail("field 'moe_layer_freq' must be > 0");
    for (std::int64_t i = c.num_dense_layers; i < c.num_layers; ++i)
      if (i % freq != 0) c.mlp_only_layers.push_back(i);
    c.router_scoring =
        read_scoring(r, v3_defaults ? RouterScoring::sigmoid : RouterScoring::softmax);
    c.norm_topk_prob = r.boolean_or("norm_topk_prob", v3_defaults);
    const std::string method = r.string_or("topk_method", v3_defaults ? "noaux_tc" : "greedy");
    c.router_score_correction = method == "noaux_tc";
    // Group-limited choice: noaux_tc (V3, Kimi-K2) always groups (transformers' defaults
    // n_group 8, topk_group 4, routed_scaling_factor 2.5); V2's group_limited_greedy groups
    // a softmax, which the trainer does not implement (audit_unmodelled names it).
    if (method == "noaux_tc") {
      c.n_group = r.integer_or("n_group", 8);
      c.topk_group = r.integer_or("topk_group", 4);
      c.routed_scaling_factor = r.number_or("routed_scaling_factor", 2.5);
    }
  }
  c.num_mtp_layers = r.integer_or("num_nextn_predict_layers", 0);
  read_dense_width(r, c);
}

// Qwen3-MoE and Qwen2-MoE. Qwen2-MoE adds one gated shared expert of its own
// width and biases q/k/v (not o); Qwen3 adds per-head q/k RMSNorm.
void read_qwen_moe(const HfFields& r, ModelConfig& c, bool qwen3) {
  read_gqa(r, c, false);
  // Hub checkpoints say num_experts; transformers 5's save_pretrained writes num_local_experts.
  c.num_experts = r.integer_any({"num_experts", "num_local_experts"});
  if (c.num_experts > 0) {
    c.top_k = r.integer("num_experts_per_tok");
    c.moe_intermediate_size = r.integer("moe_intermediate_size");
  }
  c.moe_layer_step = r.integer_or("decoder_sparse_step", 1);
  if (c.moe_layer_step == 0) r.fail("field 'decoder_sparse_step' must be > 0");
  c.mlp_only_layers = layer_set(r, "mlp_only_layers");
  c.router_scoring = RouterScoring::softmax;
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  if (qwen3) {
    c.qk_norm = true;
    c.attention_qkv_bias = c.attention_out_bias = r.boolean_or("attention_bias", false);
  } else {
    c.attention_qkv_bias = r.boolean_or("qkv_bias", true);  // Qwen2-MoE's field (transformers 5.x)
    if (c.num_experts > 0) {
      c.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size");
      if (c.shared_expert_intermediate_size > 0) {
        c.num_shared_experts = 1;
        c.shared_expert_gate = true;
      }
    }
  }
  read_dense_width(r, c);
}

// dots.llm1 (rednote, model_type dots1): Qwen3's attention (q/k RMSNorm per head) with
// DeepSeek-V3's MoE: the sigmoid router with its score-correction bias, group-limited top-k
// (Dots1Config's defaults: one group), routed_scaling_factor, shared experts stored as one
// MLP, first_k_dense_replace leading dense layers.
void read_dots1(const HfFields& r, ModelConfig& c) {
  read_gqa(r, c, false);
  c.qk_norm = true;
  c.attention_qkv_bias = c.attention_out_bias = r.boolean_or("attention_bias", false);
  c.num_experts = r.integer_any({"n_routed_experts", "num_local_experts"});
  if (c.num_experts > 0) {
    c.top_k = r.integer("num_experts_per_tok");
    c.moe_intermediate_size = r.integer("moe_intermediate_size");
    c.num_shared_experts = r.integer_or("n_shared_experts", 0);
    c.num_dense_layers = r.integer_or("first_k_dense_replace", 0);
    c.router_scoring = RouterScoring::sigmoid;
    c.router_score_correction = true;
    c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
    c.n_group = r.integer_or("n_group", 1);
    c.topk_group = r.integer_or("topk_group", 1);
    c.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.0);
  }
  read_dense_width(r, c);
}

// Mixtral: every layer MoE, intermediate_size is the expert width.
void read_mixtral(const HfFields& r, ModelConfig& c) {
  read_gqa(r, c, false);
  c.num_experts = r.integer("num_local_experts");
  c.top_k = r.integer("num_experts_per_tok");
  c.moe_intermediate_size = r.integer("intermediate_size");
  c.router_scoring = RouterScoring::softmax;  // softmax of the top-k logits
  c.norm_topk_prob = true;
}

// gpt-oss: biased attention with sinks, biased router and experts.
void read_gpt_oss(const HfFields& r, ModelConfig& c) {
  read_gqa(r, c, true);
  c.num_experts = r.integer("num_local_experts");
  c.top_k = r.integer_any({"experts_per_token", "num_experts_per_tok"});
  c.moe_intermediate_size = r.integer("intermediate_size");
  c.router_scoring = RouterScoring::softmax;  // softmax of the top-k logits
  c.norm_topk_prob = true;
  c.router_bias = true;
  c.mlp_bias = true;
  c.attention_qkv_bias = c.attention_out_bias = r.boolean_or("attention_bias", true);
  c.attention_sinks = true;
  c.swiglu_limit = r.number_or("swiglu_limit", 7.0);  // GptOssConfig's defaults
  c.swiglu_alpha = r.number_or("swiglu_alpha", 1.702);
  if (!(c.swiglu_limit > 0.0 && c.swiglu_limit < 1e6)) r.fail("field 'swiglu_limit' must be a finite number > 0");
  if (!(c.swiglu_alpha > 0.0 && c.swiglu_alpha < 1e6)) r.fail("field 'swiglu_alpha' must be a finite number > 0");
}

// Dense Llama-like families; each differs only in which biases and norms exist.
void read_dense(const HfFields& r, ModelConfig& c) {
  read_gqa(r, c, false);
  c.num_dense_layers = c.num_layers;
  c.dense_intermediate_size = r.integer("intermediate_size");
  const std::string& t = r.model_type();
  if (t == "qwen2") {
    c.attention_qkv_bias = true;
  } else if (t == "mistral") {
    // no biases
  } else {
    c.attention_qkv_bias = c.attention_out_bias = r.boolean_or("attention_bias", false);
    c.mlp_bias = r.boolean_or("mlp_bias", false);
    c.qk_norm = t == "qwen3";
  }
}

// Unknown model_type: generic names. MLA when kv_lora_rank is present, MoE when
// an expert count is, dense otherwise.
void read_generic(const HfFields& r, ModelConfig& c) {
  if (r.has("kv_lora_rank")) {
    read_deepseek(r, c, false);
    return;
  }
  read_gqa(r, c, false);
  c.attention_qkv_bias = c.attention_out_bias = r.boolean_or("attention_bias", false);
  c.mlp_bias = r.boolean_or("mlp_bias", false);
  const auto experts_keys = {"num_local_experts", "num_experts", "n_routed_experts"};
  c.num_experts = r.has_any(experts_keys) ? r.integer_any(experts_keys) : 0;
  if (c.num_experts == 0) {
    c.num_dense_layers = c.num_layers;
    c.dense_intermediate_size = r.integer("intermediate_size");
    return;
  }
  c.top_k = r.integer_any({"num_experts_per_tok", "experts_per_token"});
  c.moe_intermediate_size = r.integer_any({"moe_intermediate_size", "intermediate_size"});
  c.num_dense_layers = r.integer_or("first_k_dense_replace", 0);
  c.moe_layer_step = r.integer_or("decoder_sparse_step", 1);
  if (c.moe_layer_step == 0) r.fail("field 'decoder_sparse_step' must be > 0");
  c.mlp_only_layers = layer_set(r, "mlp_only_layers");
  c.num_shared_experts = r.integer_or("n_shared_experts", r.integer_or("num_shared_experts", 0));
  c.shared_expert_intermediate_size = r.integer_or("shared_expert_intermediate_size", 0);
  if (c.num_shared_experts == 0 && c.shared_expert_intermediate_size > 0) c.num_shared_experts = 1;
  c.router_scoring = read_scoring(r, RouterScoring::softmax);
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  c.router_score_correction = r.string_or("topk_method", "") == "noaux_tc";
  if (c.num_moe_layers() < c.num_layers) c.dense_intermediate_size = r.integer("intermediate_size");
}

// RoPE base: top-level rope_theta (transformers 4.x) or rope_parameters.rope_theta
// (5.x); absent, the family's transformers default (Mixtral 1e6, gpt-oss 150000,
// everything else 10000).
void read_rope_theta(const json& config, const HfFields& r, ModelConfig& c) {
  const std::string& t = r.model_type();
  c.rope_theta = t == "mixtral" ? 1e6 : t == "gpt_oss" ? 150000.0 : 10000.0;
  const json* v = nullptr;
  const char* field = "rope_theta";
  if (config.contains("rope_theta") && !config.at("rope_theta").is_null()) {
    v = &config.at("rope_theta");
  } else if (config.contains("rope_parameters") && config.at("rope_parameters").is_object() &&
             config.at("rope_parameters").contains("rope_theta") &&
             !config.at("rope_parameters").at("rope_theta").is_null()) {
    v = &config.at("rope_parameters").at("rope_theta");
    field = "rope_parameters.rope_theta";
  }
  if (v == nullptr) return;
  if (!v->is_number())
    r.fail(std::string("field '") + field + "' must be a number, got " + v->type_name());
  c.rope_theta = v->get<double>();
}

// A number field with a default; a present non-number is an error naming the field.
double number_or(const json& config, const HfFields& r, const char* field, double fallback) {
  if (!config.contains(field) || config.at(field).is_null()) return fallback;
  const json& v = config.at(field);
  if (!v.is_number()) r.fail(std::string("field '") + field + "' must be a number, got " + v.type_name());
  return v.get<double>();
}

// The rope object whose rope_type counts: transformers 5's rope_parameters when it names a
// type, else transformers 4's rope_scaling (standardize_rope_params merges them so).
// Null when neither is an object naming a type.
const json* rope_object(const json& config, std::string* where) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!config.contains(key) || !config.at(key).is_object()) continue;
    const json& o = config.at(key);
    for (const char* type : {"rope_type", "type"})
      if (o.contains(type) && o.at(type).is_string()) {
        *where = key;
        return &o;
      }
  }
  return nullptr;
}

std::string rope_type_of(const json& o) {
  for (const char* type : {"rope_type", "type"})  // rope_type wins, as transformers reads them
    if (o.contains(type) && !o.at(type).is_null()) return o.at(type).is_string() ? o.at(type).get<std::string>() : "";
  return "default";
}

// YaRN (rope_type "yarn") as transformers' _compute_yarn_parameters reads it: factor (null:
// max_position_embeddings / original_max_position_embeddings), original_max_position_embeddings,
// beta_fast / beta_slow (null or 0: 32 and 1), truncate (default true), and the cos/sin
// factor: attention_factor, else get_mscale(factor, mscale) / get_mscale(factor,
// mscale_all_dim) when both are non-zero, else get_mscale(factor).
void read_rope_scaling(const json& config, const HfFields& r, ModelConfig& c) {
  std::string where;
  const json* o = rope_object(config, &where);
  if (o == nullptr || rope_type_of(*o) != "yarn") return;
  auto number = [&](const char* key, double fallback) {
    if (!o->contains(key) || o->at(key).is_null()) return fallback;
    const json& v = o->at(key);
    if (!v.is_number()) r.fail(where + "." + key + " must be a number, got " + v.type_name());
    return v.get<double>();
  };
  RopeScaling& y = c.rope_scaling;
  y.yarn = true;
  const double original = number("original_max_position_embeddings", 0.0);
  if (!(original > 0.0))
    r.fail(where + ": yarn needs original_max_position_embeddings (the pretraining context), a number > 0");
  y.original_max_position = static_cast<std::int64_t>(original);
  double factor = number("factor", 0.0);
  if (!o->contains("factor") || o->at("factor").is_null()) {
    const double max_position = number_or(config, r, "max_position_embeddings", 0.0);
    if (!(max_position > 0.0))
      r.fail(where + ": yarn without a factor needs max_position_embeddings (factor = it / the original)");
    factor = max_position / original;
  }
  y.factor = factor;
  const double beta_fast = number("beta_fast", 0.0), beta_slow = number("beta_slow", 0.0);
  y.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;  // transformers: `get("beta_fast") or 32`
  y.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  if (o->contains("truncate") && !o->at("truncate").is_null()) {
    if (!o->at("truncate").is_boolean()) r.fail(where + ".truncate must be true or false");
    y.truncate = o->at("truncate").get<bool>();
  }
  const double mscale = number("mscale", 0.0), mscale_all_dim = number("mscale_all_dim", 0.0);
  if (o->contains("attention_factor") && !o->at("attention_factor").is_null())
    y.attention_factor = number("attention_factor", 1.0);
  else if (mscale != 0.0 && mscale_all_dim != 0.0)
    y.attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim);
  else
    y.attention_factor = yarn_get_mscale(factor);
  // MLA's softmax scale (transformers' yarn_apply_mscale in DeepseekV3Attention).
  if (c.attention == AttentionKind::mla && mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(factor, mscale_all_dim);
    c.attention_softmax_factor = m * m;
  }
}

// The training fields: norm epsilon, the aux-loss coefficient (counted only when
// output_router_logits is true, as transformers does), the init scale. Defaults are
// transformers' (Mixtral's eps 1e-5, the others 1e-6; aux coefficient 0.001).
void read_training_fields(const json& config, const HfFields& r, ModelConfig& c) {
  c.rms_norm_eps = number_or(config, r, "rms_norm_eps", r.model_type() == "mixtral" ? 1e-5 : 1e-6);
  const double coef = number_or(config, r, "router_aux_loss_coef", 0.001);
  c.router_aux_loss_coef = r.boolean_or("output_router_logits", false) ? coef : 0.0;
  c.initializer_range = number_or(config, r, "initializer_range", 0.02);
}

// A value as an unmodelled entry quotes it: JSON text, cut at 60 characters.
std::string quoted(const json& v) {
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  if (s.size() > 60) {
    std::size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

// The RoPE settings of one rope_scaling / rope_parameters object (`where` is its field
// name): a rope_type (or the legacy "type") other than "default" (or "yarn" where
// `yarn_read`: the object read_rope_scaling reads), and a partial rotary factor other than
// 1, change the rotary embedding the trainer computes. A per-attention-type object
// (!top_level) may only say "default": the trainer has one RoPE for every layer.
void audit_rope_object(const json& o, const std::string& where, bool top_level, bool yarn_read,
                       std::vector<std::string>& out) {
  for (const char* key : {"rope_type", "type"}) {
    if (!o.contains(key) || o.at(key).is_null()) continue;
    const json& t = o.at(key);
    const bool ok = t.is_string() && (t.get<std::string>() == "default" || (yarn_read && t.get<std::string>() == "yarn"));
    if (!ok)
      out.push_back(where + "." + key + " = " + quoted(t) +
                    (top_level ? ": the trainer implements the unscaled RoPE and YaRN (rope_type \"default\" or "
                                 "\"yarn\"; linear, dynamic, llama3 and longrope are not)"
                               : ": the trainer implements one RoPE for every layer (per attention type only "
                                 "\"default\")"));
    break;  // rope_type wins over type, as transformers reads them
  }
  if (o.contains("partial_rotary_factor") && !o.at("partial_rotary_factor").is_null() &&
      !(o.at("partial_rotary_factor").is_number() && o.at("partial_rotary_factor").get<double>() == 1.0))
    out.push_back(where + ".partial_rotary_factor = " + quoted(o.at("partial_rotary_factor")) +
                  ": the trainer rotates the whole head (1.0)");
}

// Fields that change what the model computes but not its shape, each compared with what
// the trainer implements (see ModelConfig::unmodelled). Absent or null fields, and values
// equal to the implemented behaviour, are accepted.
void audit_unmodelled(const json& config, ModelConfig& c) {
  std::vector<std::string>& out = c.unmodelled;
  auto present = [&](const char* key) { return config.contains(key) && !config.at(key).is_null(); };
  // The MLP activation: SiLU ("swish" is transformers' other name for it).
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (!present(key)) continue;
    const json& v = config.at(key);
    if (!v.is_string() || (v.get<std::string>() != "silu" && v.get<std::string>() != "swish"))
      out.push_back(std::string(key) + " = " + quoted(v) + ": the trainer implements SiLU (\"silu\") only");
  }
  // RoPE scaling: transformers 4's rope_scaling, transformers 5's rope_parameters (one
  // object, or one per attention type), and a top-level partial_rotary_factor.
  // The object read_rope_scaling reads may say yarn; the other may not contradict it.
  std::string read_from;
  const json* read = rope_object(config, &read_from);
  const std::string read_type = read != nullptr ? rope_type_of(*read) : "default";
  if (present("rope_scaling")) {
    const json& v = config.at("rope_scaling");
    if (v.is_object()) {
      audit_rope_object(v, "rope_scaling", true, read == &v && read_type == "yarn", out);
    } else {
      out.push_back("rope_scaling = " + quoted(v) + ": the trainer implements the unscaled RoPE (null) and YaRN");
    }
  }
  if (present("rope_parameters") && config.at("rope_parameters").is_object()) {
    const json& v = config.at("rope_parameters");
    audit_rope_object(v, "rope_parameters", true, read == &v && read_type == "yarn", out);
    for (const auto& [k, sub] : v.items())
      if (sub.is_object()) audit_rope_object(sub, "rope_parameters." + k, false, false, out);
  }
  if (present("partial_rotary_factor") &&
      !(config.at("partial_rotary_factor").is_number() && config.at("partial_rotary_factor").get<double>() == 1.0))
    out.push_back("partial_rotary_factor = " + quoted(config.at("partial_rotary_factor")) +
                  ": the trainer rotates the whole head (1.0)");
  // Numbers whose implemented value is fixed: dropout and router jitter (training-time
  // noise transformers applies) 0, DeepSeek's routed_scaling_factor and Granite's
  // multipliers 1.
  struct Fixed {
    const char* key;
    double value;
    const char* what;
  };
  for (const Fixed& f : {Fixed{"attention_dropout", 0.0, "the trainer implements no attention dropout (0.0)"},
                         Fixed{"hidden_dropout", 0.0, "the trainer implements no dropout (0.0)"},
                         Fixed{"router_jitter_noise", 0.0, "the trainer implements no router jitter (0.0)"},
                         Fixed{"embedding_multiplier", 1.0, "the trainer does not scale the embedding (1.0)"},
                         Fixed{"residual_multiplier", 1.0, "the trainer does not scale the residual (1.0)"},
                         Fixed{"logits_scaling", 1.0, "the trainer does not scale the logits (1.0)"}}) {
    if (!present(f.key)) continue;
    const json& v = config.at(f.key);
    if (!v.is_number() || v.get<double>() != f.value) out.push_back(std::string(f.key) + " = " + quoted(v) + ": " + f.what);
  }
  // The routed experts' scale: modelled with DeepSeek's sigmoid router (ModelConfig::
  // routed_scaling_factor), fixed at 1 with any other.
  if (present("routed_scaling_factor") && c.router_scoring != RouterScoring::sigmoid) {
    const json& v = config.at("routed_scaling_factor");
    if (!v.is_number() || v.get<double>() != 1.0)
      out.push_back("routed_scaling_factor = " + quoted(v) +
                    ": the trainer scales the routed experts only with sigmoid scoring (1.0)");
  }
  if (present("topk_method") && config.at("topk_method").is_string() &&
      config.at("topk_method").get<std::string>() == "group_limited_greedy")
    out.push_back("topk_method = \"group_limited_greedy\": the trainer implements \"greedy\" and \"noaux_tc\"");
  // Features with no neutral value: any non-null value changes the model.
  const bool gpt_oss = c.family == "gpt_oss";  // its experts' clamped SwiGLU is modelled
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping", "attention_multiplier",
                          "query_pre_attn_scalar", "swiglu_limit"})
    if (present(key) && !(gpt_oss && std::string_view(key) == "swiglu_limit"))
      out.push_back(std::string(key) + " = " + quoted(config.at(key)) + ": not implemented by the trainer (null)");
}

}  // namespace

ModelConfig parse_hf_config(const nlohmann::json& config, std::string name,
                            const std::string& source) {
  if (!config.is_object())
    throw InvalidArgument(source + ": expected a JSON object at the top level, got " +
                          std::string(config.type_name()));
  std::string model_type;
  if (config.contains("model_type") && config.at("model_type").is_string())
    model_type = config.at("model_type").get<std::string>();

  const bool known = model_type == "deepseek_v3" || model_type == "deepseek_v2" || model_type == "kimi_k2" ||
                     model_type == "dots1" ||
                     model_type == "qwen3_moe" || model_type == "qwen2_moe" ||
                     model_type == "mixtral" || model_type == "gpt_oss" ||
                     model_type == "llama" || model_type == "mistral" || model_type == "qwen2" ||
                     model_type == "qwen3";
  const HfFields r(config, source, model_type, known ? "" : "read with generic field names");

  ModelConfig c;
  c.name = std::move(name);
  read_common(r, c);
  if (model_type == "deepseek_v3" || model_type == "deepseek_v2" || model_type == "kimi_k2") {
    read_deepseek(r, c, model_type != "deepseek_v2");  // Kimi-K2 is DeepSeek-V3's architecture
  } else if (model_type == "qwen3_moe" || model_type == "qwen2_moe") {
    read_qwen_moe(r, c, model_type == "qwen3_moe");
  } else if (model_type == "dots1") {
    read_dots1(r, c);
  } else if (model_type == "mixtral") {
    read_mixtral(r, c);
  } else if (model_type == "gpt_oss") {
    read_gpt_oss(r, c);
  } else if (known) {
    read_dense(r, c);
  } else {
    read_generic(r, c);
  }
  read_sliding_window(r, c);
  read_rope_theta(config, r, c);
  read_rope_scaling(config, r, c);
  read_training_fields(config, r, c);
  audit_unmodelled(config, c);

  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    r.fail(e.what());
  }
  return c;
}

ModelConfig parse_hf_config(const nlohmann::json& config, std::string name) {
  return parse_hf_config(config, std::move(name), "config.json");
}

ModelConfig load_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file(path);
  auto cannot = [](const fs::path& f, const std::string& why) {
    return InvalidArgument("cannot read model config '" + f.string() + "': " + why);
  };
  std::error_code ec;
  fs::file_status st = fs::status(file, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) throw cannot(file, ec.message());
  if (fs::is_directory(st)) {
    const fs::path dir = file;
    file /= "config.json";
    st = fs::status(file, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) throw cannot(file, ec.message());
    if (!fs::exists(st)) throw cannot(dir, "it is a directory with no config.json in it");
  }
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw cannot(file, fs::is_directory(st) ? "it is a directory, not a file"
                                            : "it is not a regular file (a FIFO, socket or device is not read)");
  // A config.json is a few KiB; a huge file is not one, and is not read into memory.
  constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;
  if (fs::exists(st)) {
    const std::uintmax_t size = fs::file_size(file, ec);
    if (!ec && size > kMaxConfigBytes)
      throw cannot(file, "it is " + std::to_string(size) + " bytes; a config.json is at most 16 MiB");
  }

  errno = 0;
  std::ifstream in(file);
  if (!in) throw cannot(file, errno ? std::strerror(errno) : "open failed");
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    // The parser quotes the bytes it stopped at: keep the message one printable line.
    std::string why;
    for (char ch : std::string(e.what())) why += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    throw InvalidArgument(file.string() + ": invalid JSON: " + why);
  }
  // ".../DeepSeek-V3/config.json" names the model "DeepSeek-V3".
  fs::path abs = fs::absolute(file, ec);
  std::string name = (ec ? file : abs).parent_path().filename().string();
  if (name.empty()) name = file.stem().string();
  return parse_hf_config(config, name, file.string());
}

}  // namespace peakbound
