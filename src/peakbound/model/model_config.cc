#include "peakbound/model/model_config.h"

#include <algorithm>

#include "peakbound/core/error.h"

namespace peakbound {

std::string_view attention_kind_name(AttentionKind k) {
  return k == AttentionKind::mla ? "mla" : "gqa";
}

std::string_view router_scoring_name(RouterScoring s) {
  return s == RouterScoring::sigmoid ? "sigmoid" : "softmax";
}

bool ModelConfig::is_moe_layer(std::int64_t layer) const {
  if (num_experts <= 0 || layer < num_dense_layers || moe_layer_step <= 0) return false;
  if ((layer + 1) % moe_layer_step != 0) return false;
  return !std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), layer);
}

std::int64_t ModelConfig::attention_window(std::int64_t layer) const {
  return std::binary_search(sliding_layers.begin(), sliding_layers.end(), layer) ? sliding_window : 0;
}

std::int64_t ModelConfig::num_moe_layers() const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

std::int64_t ModelConfig::qk_head_dim() const {
  return attention == AttentionKind::mla ? qk_nope_head_dim + qk_rope_head_dim : head_dim;
}

std::int64_t ModelConfig::value_head_dim() const {
  return attention == AttentionKind::mla ? v_head_dim : head_dim;
}

std::int64_t ModelConfig::shared_expert_width() const {
  return shared_expert_intermediate_size > 0 ? shared_expert_intermediate_size
                                             : moe_intermediate_size;
}

namespace {

// Every size is bounded so that products of a few of them stay far inside int64;
// 2^30 is orders of magnitude above any real model dimension. Layers get a
// tighter bound because layout queries walk them one by one.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 30;

class Checker {
 public:
  explicit Checker(const ModelConfig& c) : prefix_("model '" + c.name + "': ") {}

  [[noreturn]] void fail(const std::string& what) const { throw InvalidArgument(prefix_ + what); }

  void positive(const char* field, std::int64_t v) const {
    if (v <= 0) fail(std::string(field) + " must be > 0, got " + std::to_string(v));
    bounded(field, v);
  }
  void non_negative(const char* field, std::int64_t v) const {
    if (v < 0) fail(std::string(field) + " must be >= 0, got " + std::to_string(v));
    bounded(field, v);
  }

 private:
  void bounded(const char* field, std::int64_t v) const {
    if (v > kMaxDim)
      fail(std::string(field) + " = " + std::to_string(v) + " is implausibly large (max 2^30)");
  }
  std::string prefix_;
};

}  // namespace

bool ModelConfig::merged_shared_experts() const {
  return family == "deepseek_v3" || family == "deepseek_v2" || family == "kimi_k2" || family == "dots1";
}

void ModelConfig::validate() const {
  if (name.empty()) throw InvalidArgument("model config has an empty name");
  Checker c(*this);

  c.positive("vocab_size", vocab_size);
  c.positive("hidden_size", hidden_size);
  c.positive("num_layers", num_layers);
  if (num_layers > ModelConfig::kMaxLayers)
    c.fail("num_layers = " + std::to_string(num_layers) + " is implausibly large (max 65536)");
  c.non_negative("max_position_embeddings", max_position_embeddings);

  // Layout.
  c.non_negative("num_dense_layers", num_dense_layers);
  if (num_dense_layers > num_layers)
    c.fail("num_dense_layers (" + std::to_string(num_dense_layers) + ") exceeds num_layers (" +
           std::to_string(num_layers) + ")");
  c.positive("moe_layer_step", moe_layer_step);
  for (std::size_t i = 0; i < mlp_only_layers.size(); ++i) {
    const std::int64_t layer = mlp_only_layers[i];
    if (layer < 0 || layer >= num_layers)
      c.fail("mlp_only_layers entry " + std::to_string(layer) + " is outside [0, " +
             std::to_string(num_layers) + ")");
    if (i > 0 && layer <= mlp_only_layers[i - 1])
      c.fail("mlp_only_layers must be increasing without repeats (" + std::to_string(layer) + " after " +
             std::to_string(mlp_only_layers[i - 1]) + ")");
  }
  c.non_negative("dense_intermediate_size", dense_intermediate_size);
  if (num_moe_layers() < num_layers && dense_intermediate_size == 0)
    c.fail("dense_intermediate_size must be > 0: " +
           std::to_string(num_layers - num_moe_layers()) + " layer(s) have a dense MLP");

  // Experts.
  c.non_negative("num_experts", num_experts);
  c.non_negative("top_k", top_k);
  c.non_negative("num_shared_experts", num_shared_experts);
  c.non_negative("moe_intermediate_size", moe_intermediate_size);
  c.non_negative("shared_expert_intermediate_size", shared_expert_intermediate_size);
  if (num_experts == 0) {
    if (top_k != 0) c.fail("top_k is " + std::to_string(top_k) + " but num_experts is 0 (dense)");
    if (num_shared_experts != 0) c.fail("num_shared_experts needs num_experts > 0");
  } else {
    if (top_k == 0) c.fail("top_k must be > 0 when num_experts > 0");
    if (top_k > num_experts)
      c.fail("top_k (" + std::to_string(top_k) + ") exceeds num_experts (" +
             std::to_string(num_experts) + ")");
    c.positive("moe_intermediate_size", moe_intermediate_size);
  }
  c.positive("n_group", n_group);
  if (topk_group < 1 || topk_group > n_group)
    c.fail("topk_group must be in [1, n_group = " + std::to_string(n_group) + "], got " + std::to_string(topk_group));
  if (num_experts > 0 && num_experts % n_group != 0)
    c.fail("n_group (" + std::to_string(n_group) + ") must divide num_experts (" + std::to_string(num_experts) + ")");
  if (!(routed_scaling_factor > 0.0) || !(routed_scaling_factor < 1e6))
    c.fail("routed_scaling_factor must be positive and finite, got " + std::to_string(routed_scaling_factor));
  if (shared_expert_gate && num_shared_experts == 0)
    c.fail("shared_expert_gate needs num_shared_experts > 0");

  // Attention.
  c.positive("num_heads", num_heads);
  if (attention == AttentionKind::gqa) {
    c.positive("num_kv_heads", num_kv_heads);
    c.positive("head_dim", head_dim);
    if (num_heads % num_kv_heads != 0)
      c.fail("num_kv_heads (" + std::to_string(num_kv_heads) + ") does not divide num_heads (" +
             std::to_string(num_heads) + ")");
    if (q_lora_rank || kv_lora_rank || qk_nope_head_dim || qk_rope_head_dim || v_head_dim)
      c.fail("MLA dimensions are set but attention is gqa");
  } else {
    if (num_kv_heads != num_heads)
      c.fail("MLA needs num_kv_heads == num_heads (" + std::to_string(num_heads) + "), got " +
             std::to_string(num_kv_heads));
    if (head_dim != 0) c.fail("head_dim must be 0 under MLA; set qk_nope/qk_rope/v_head_dim");
    if (qk_norm) c.fail("qk_norm is not defined for MLA");
    c.non_negative("q_lora_rank", q_lora_rank);
    c.positive("kv_lora_rank", kv_lora_rank);
    c.non_negative("qk_nope_head_dim", qk_nope_head_dim);
    c.positive("qk_rope_head_dim", qk_rope_head_dim);
    c.positive("v_head_dim", v_head_dim);
  }

  // Negated so that NaN fails too.
  if (!(rope_theta > 0.0 && rope_theta < 1e300))
    c.fail("rope_theta must be a finite number > 0, got " + std::to_string(rope_theta));
  if (rope_scaling.yarn) {
    const RopeScaling& y = rope_scaling;
    if (!(y.factor >= 1.0 && y.factor < 1e6))
      c.fail("the yarn rope scaling's factor must be a finite number >= 1, got " + std::to_string(y.factor));
    if (y.original_max_position <= 0)
      c.fail("the yarn rope scaling's original_max_position_embeddings must be > 0, got " +
             std::to_string(y.original_max_position));
    if (!(y.beta_fast > 0.0 && y.beta_fast < 1e6 && y.beta_slow > 0.0 && y.beta_slow < 1e6))
      c.fail("the yarn rope scaling's beta_fast and beta_slow must be finite numbers > 0, got " +
             std::to_string(y.beta_fast) + " and " + std::to_string(y.beta_slow));
    if (!(y.attention_factor > 0.0 && y.attention_factor < 1e6))
      c.fail("the yarn rope scaling's attention_factor must be a finite number > 0, got " +
             std::to_string(y.attention_factor));
  }
  if (!(rms_norm_eps >= 0.0 && rms_norm_eps < 1.0))
    c.fail("rms_norm_eps must be in [0, 1), got " + std::to_string(rms_norm_eps));
  if (!(seq_aux_loss_coef >= 0.0 && seq_aux_loss_coef < 1e6))
    c.fail("seq_aux_loss_coef must be a finite number >= 0, got " + std::to_string(seq_aux_loss_coef));
  if (!(router_aux_loss_coef >= 0.0 && router_aux_loss_coef < 1e6))
    c.fail("router_aux_loss_coef must be a finite number >= 0, got " + std::to_string(router_aux_loss_coef));
  if (!(initializer_range >= 0.0 && initializer_range < 1e6))
    c.fail("initializer_range must be a finite number >= 0, got " + std::to_string(initializer_range));

  c.non_negative("num_mtp_layers", num_mtp_layers);
  c.non_negative("sliding_window", sliding_window);
  c.non_negative("num_sliding_layers", num_sliding_layers);
  if (num_sliding_layers > num_layers)
    c.fail("num_sliding_layers (" + std::to_string(num_sliding_layers) +
           ") exceeds num_layers (" + std::to_string(num_layers) + ")");
  if (num_sliding_layers > 0 && sliding_window == 0)
    c.fail("num_sliding_layers > 0 needs sliding_window > 0");
  if (static_cast<std::int64_t>(sliding_layers.size()) != num_sliding_layers)
    c.fail("sliding_layers lists " + std::to_string(sliding_layers.size()) + " layers but num_sliding_layers is " +
           std::to_string(num_sliding_layers));
  for (std::size_t i = 0; i < sliding_layers.size(); ++i) {
    const std::int64_t layer = sliding_layers[i];
    if (layer < 0 || layer >= num_layers)
      c.fail("sliding_layers entry " + std::to_string(layer) + " is outside [0, " + std::to_string(num_layers) + ")");
    if (i > 0 && layer <= sliding_layers[i - 1])
      c.fail("sliding_layers must be increasing without repeats (" + std::to_string(layer) + " after " +
             std::to_string(sliding_layers[i - 1]) + ")");
  }
}

}  // namespace peakbound
