#include "peakbound/model/presets.h"

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

// DeepSeek's YaRN (rope_scaling type yarn over original 4096, mscale = mscale_all_dim = 1):
// cos and sin keep their scale (attention_factor 1); the attention's softmax scale takes
// get_mscale(factor, mscale_all_dim)^2. beta_fast / beta_slow stay 32 / 1 unless the caller
// sets them.
void deepseek_yarn(ModelConfig& c, double factor) {
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = factor;
  c.rope_scaling.original_max_position = 4096;
  c.rope_scaling.attention_factor = 1.0;
  const double m = yarn_get_mscale(factor, 1.0);
  c.attention_softmax_factor = m * m;
}

// deepseek-ai/DeepSeek-V3 config.json.
Preset deepseek_v3() {
  ModelConfig c;
  c.name = "deepseek-v3";
  c.family = "deepseek_v3";
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.num_layers = 61;
  c.max_position_embeddings = 163840;
  c.num_dense_layers = 3;  // first_k_dense_replace
  c.dense_intermediate_size = 18432;
  c.num_experts = 256;
  c.top_k = 8;
  c.moe_intermediate_size = 2048;
  c.num_shared_experts = 1;
  c.router_scoring = RouterScoring::sigmoid;
  c.norm_topk_prob = true;
  c.router_score_correction = true;  // topk_method noaux_tc
  c.n_group = 8;
  c.topk_group = 4;
  c.routed_scaling_factor = 2.5;
  c.attention = AttentionKind::mla;
  c.num_heads = 128;
  c.num_kv_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.num_mtp_layers = 1;
  deepseek_yarn(c, 40.0);  // rope_scaling: yarn, factor 40, beta 32 / 1
  c.rope_interleave = true;
  Preset p;
  p.config = c;
  p.published_total = 671e9;
  p.published_active = 36.6e9;
  p.active_convention = ActiveConvention::without_embedding;
  p.published_total_with_mtp = 685e9;
  p.source = "DeepSeek-V3 README_WEIGHTS.md: 671B main model, 36.6B activated (incl. output "
             "head, excl. embedding; the paper rounds to 37B), 685B with the MTP module";
  return p;
}

// moonshotai/Kimi-K2-Instruct config.json (model_type kimi_k2): DeepSeek-V3's architecture
// with 384 experts in one group, 64 heads, one dense layer, the vocabulary of 163840 and
// YaRN factor 32 with beta_fast = beta_slow = 1 over rope_theta 50000.
Preset kimi_k2() {
  Preset p = deepseek_v3();
  ModelConfig& c = p.config;
  c.name = "kimi-k2";
  c.family = "kimi_k2";
  c.vocab_size = 163840;
  c.max_position_embeddings = 131072;
  c.num_dense_layers = 1;
  c.num_experts = 384;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.827;
  c.num_heads = 64;
  c.num_kv_heads = 64;
  c.num_mtp_layers = 0;
  c.rope_theta = 50000.0;
  deepseek_yarn(c, 32.0);
  c.rope_scaling.beta_fast = 1.0;
  c.rope_scaling.beta_slow = 1.0;
  p.published_total = 1.04e12;
  p.published_active = 32.6e9;
  p.active_convention = ActiveConvention::with_embedding;
  p.published_total_with_mtp = 0;
  p.source = "Kimi K2 technical report: 1.04T total parameters, 32.6B activated";
  return p;
}

// Qwen3-MoE config.json shared fields; the two sizes differ only in widths.
ModelConfig qwen3_moe(std::string name, std::int64_t hidden, std::int64_t layers,
                      std::int64_t heads, std::int64_t intermediate, std::int64_t moe_width) {
  ModelConfig c;
  c.name = std::move(name);
  c.family = "qwen3_moe";
  c.rope_theta = 1000000.0;  // config.json rope_theta
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.max_position_embeddings = 40960;
  c.dense_intermediate_size = intermediate;  // config's intermediate_size; no layer uses it
  c.num_experts = 128;
  c.top_k = 8;
  c.moe_intermediate_size = moe_width;
  c.router_scoring = RouterScoring::softmax;
  c.norm_topk_prob = true;
  c.num_heads = heads;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.qk_norm = true;
  return c;
}

// Qwen/Qwen3-235B-A22B config.json.
Preset qwen3_235b() {
  Preset p;
  p.config = qwen3_moe("qwen3-235b-a22b", 4096, 94, 64, 12288, 1536);
  p.published_total = 235e9;
  p.published_active = 22e9;
  p.active_convention = ActiveConvention::with_embedding;
  p.source = "Qwen3-235B-A22B model card: 235B total, 22B activated";
  return p;
}

// Qwen/Qwen3-30B-A3B config.json.
Preset qwen3_30b() {
  Preset p;
  p.config = qwen3_moe("qwen3-30b-a3b", 2048, 48, 32, 6144, 768);
  p.published_total = 30.5e9;
  p.published_active = 3.3e9;
  p.active_convention = ActiveConvention::with_embedding;
  p.source = "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated (3.35B truncated)";
  return p;
}

// openai/gpt-oss-120b config.json.
Preset gpt_oss_120b() {
  ModelConfig c;
  c.name = "gpt-oss-120b";
  c.rms_norm_eps = 1e-5;
  c.family = "gpt_oss";
  c.rope_theta = 150000.0;  // config.json rope_theta
  c.vocab_size = 201088;
  c.hidden_size = 2880;
  c.num_layers = 36;
  c.max_position_embeddings = 131072;
  c.num_experts = 128;
  c.top_k = 4;
  c.moe_intermediate_size = 2880;
  c.router_scoring = RouterScoring::softmax;  // softmax over the top-k logits
  c.norm_topk_prob = true;
  c.router_bias = true;
  c.mlp_bias = true;
  c.swiglu_limit = 7.0;  // the clamped SwiGLU, alpha 1.702
  c.swiglu_alpha = 1.702;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.attention_qkv_bias = true;
  c.attention_out_bias = true;
  c.attention_sinks = true;
  c.sliding_window = 128;
  c.set_sliding_layers([](std::int64_t i) { return i % 2 == 0; });  // layer_types: sliding, full, ... (18 of 36)
  // rope_scaling: yarn, factor 32, beta 32 / 1, original 4096, truncate false; cos and sin
  // scaled by transformers' get_mscale(32) = 0.1 ln 32 + 1.
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.original_max_position = 4096;
  c.rope_scaling.truncate = false;
  c.rope_scaling.attention_factor = yarn_get_mscale(32.0);
  Preset p;
  p.config = c;
  p.published_total = 116.83e9;
  p.published_active = 5.13e9;
  p.active_convention = ActiveConvention::without_embedding;
  p.source = "gpt-oss model card: 116.83B total, 5.13B active (unembedding counted, "
             "embedding not)";
  return p;
}

// mistralai/Mixtral-8x22B-v0.1 config.json.
Preset mixtral_8x22b() {
  ModelConfig c;
  c.name = "mixtral-8x22b";
  c.rms_norm_eps = 1e-5;
  c.family = "mixtral";
  c.rope_theta = 1000000.0;  // config.json rope_theta
  c.vocab_size = 32000;
  c.hidden_size = 6144;
  c.num_layers = 56;
  c.max_position_embeddings = 65536;
  c.num_experts = 8;
  c.top_k = 2;
  c.moe_intermediate_size = 16384;
  c.router_scoring = RouterScoring::softmax;  // softmax over the top-2 logits
  c.norm_topk_prob = true;
  c.num_heads = 48;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  Preset p;
  p.config = c;
  p.published_total = 141e9;
  p.published_active = 39e9;
  p.active_convention = ActiveConvention::with_embedding;
  p.source = "Mistral AI, Mixtral 8x22B announcement: 141B total, 39B active";
  return p;
}

// The CPU-trainable models: the features of the large presets that the CPU
// kernels implement (GQA, softmax top-k routing, one leading dense layer).
ModelConfig small_model(std::string name, std::int64_t vocab, std::int64_t hidden,
                        std::int64_t layers, std::int64_t experts, std::int64_t heads,
                        std::int64_t head_dim) {
  ModelConfig c;
  c.name = std::move(name);
  c.family = "peakbound";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_dense_layers = 1;
  c.dense_intermediate_size = 4 * hidden;
  c.num_experts = experts;
  c.top_k = 2;
  c.moe_intermediate_size = 2 * hidden;
  c.router_scoring = RouterScoring::softmax;
  c.norm_topk_prob = true;
  c.num_heads = heads;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.router_aux_loss_coef = 0.01;
  return c;
}

Preset tiny_moe() {
  Preset p;
  p.config = small_model("tiny-moe", 16384, 256, 4, 8, 8, 32);
  p.source = "peakbound";
  return p;
}

// gpt-oss's architecture at tiny-moe's size: every layer MoE (its experts with biases and
// the clamped SwiGLU, the router with its bias), attention with q/k/v/o biases and sinks,
// the even layers sliding over 128 keys, the released YaRN.
Preset tiny_gptoss() {
  Preset p;
  ModelConfig c = small_model("tiny-gptoss", 16384, 256, 4, 8, 8, 32);
  c.family = "gpt_oss";
  c.num_dense_layers = 0;
  c.dense_intermediate_size = 0;
  c.moe_intermediate_size = 256;
  c.router_bias = true;
  c.mlp_bias = true;
  c.swiglu_limit = 7.0;
  c.swiglu_alpha = 1.702;
  c.attention_qkv_bias = true;
  c.attention_out_bias = true;
  c.attention_sinks = true;
  c.sliding_window = 128;
  c.set_sliding_layers([](std::int64_t i) { return i % 2 == 0; });
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 150000.0;
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.original_max_position = 4096;
  c.rope_scaling.truncate = false;
  c.rope_scaling.attention_factor = yarn_get_mscale(32.0);
  p.config = c;
  p.source = "peakbound";
  return p;
}

// DeepSeek-V3's architecture at tiny-moe's size: multi-head latent attention (8 heads,
// q_lora_rank 96, kv_lora_rank 64, qk 16 nope + 32 interleaved rope, v 32) under DeepSeek's
// YaRN (factor 40 over 4096, mscale = mscale_all_dim = 1), layer 0 dense, then the sigmoid
// router with its correction bias over 8 experts in 4 groups (2 kept), top-2 x 2.5 and one
// shared expert; no aux loss (the biases balance the load). The rope part is wider than V3's
// (32 of 48 q/k columns, V3 has 64 of 192): at this width, with V3's 1:2 split (16 rope
// columns, 8 frequencies in the one shared rope key), the copy task's induction head forms
// only after ~250 steps, past the main job's 300-step schedule's useful learning rate.
Preset tiny_deepseek() {
  Preset p;
  ModelConfig c = small_model("tiny-deepseek", 16384, 256, 4, 8, 8, 0);
  c.family = "deepseek_v3";
  c.attention = AttentionKind::mla;
  c.num_kv_heads = c.num_heads;
  c.q_lora_rank = 96;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 32;
  c.rope_interleave = true;
  deepseek_yarn(c, 40.0);
  c.moe_intermediate_size = 256;
  c.num_shared_experts = 1;
  c.router_scoring = RouterScoring::sigmoid;
  c.router_score_correction = true;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.router_aux_loss_coef = 0.0;
  p.config = c;
  p.source = "peakbound";
  return p;
}

Preset small_moe() {
  Preset p;
  p.config = small_model("small-moe", 32768, 512, 8, 16, 8, 64);
  p.source = "peakbound";
  return p;
}

const std::vector<Preset>& all_presets() {
  static const std::vector<Preset> presets = {deepseek_v3(), kimi_k2(), qwen3_235b(),   gpt_oss_120b(),
                                              mixtral_8x22b(), qwen3_30b(), tiny_moe(),
                                              tiny_gptoss(),   tiny_deepseek(), small_moe()};
  return presets;
}

}  // namespace

std::int64_t Preset::comparable_active(const ParamCount& count) const {
  return active_convention == ActiveConvention::without_embedding ? count.active_non_embedding
                                                                  : count.active;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : all_presets()) names.push_back(p.config.name);
  return names;
}

const Preset& find_preset(std::string_view name) {
  for (const Preset& p : all_presets())
    if (p.config.name == name) return p;
  std::string valid;
  for (const std::string& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw InvalidArgument("unknown model preset '" + std::string(name) + "'; valid presets: " +
                        valid);
}

ModelConfig preset_config(std::string_view name) { return find_preset(name).config; }

}  // namespace peakbound
