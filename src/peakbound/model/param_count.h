// Exact parameter counts of a ModelConfig, tensor by tensor, as the released
// checkpoints hold them: every weight and bias, RMSNorm weights, MLA's latent
// norms, router weights and DeepSeek's score-correction bias, gpt-oss's sinks.
#pragma once

#include <cstdint>

#include "peakbound/model/model_config.h"

namespace peakbound {

// Whole-model breakdown plus the per-layer figures the memory planner sizes
// shards from. total = embedding + lm_head + attention + dense_mlp +
// routed_experts + shared_experts + router + norms; MTP is kept apart.
struct ParamCount {
  std::int64_t embedding = 0;       // embed_tokens [V, H]
  std::int64_t lm_head = 0;         // [V, H]; 0 when tied to the embedding
  std::int64_t attention = 0;       // all layers, including q/k norms and MLA latent norms
  std::int64_t dense_mlp = 0;       // MLPs of the dense layers
  std::int64_t routed_experts = 0;  // all routed experts of all MoE layers
  std::int64_t shared_experts = 0;  // shared experts (and Qwen2-MoE's shared gate)
  std::int64_t router = 0;          // gate weight [E, H] plus router / correction biases
  std::int64_t norms = 0;           // input + post-attention RMSNorm per layer, final norm

  std::int64_t total = 0;  // excludes MTP
  // Parameters one token touches: total minus the routed experts it does not
  // visit, i.e. routed_experts * (1 - top_k / num_experts). Counts the embedding.
  std::int64_t active = 0;
  // active - embedding. DeepSeek and OpenAI publish this one: the embedding is a
  // row lookup, not a matmul, while the output head is.
  std::int64_t active_non_embedding = 0;

  // DeepSeek MTP modules: unique parameters (eh_proj, enorm, hnorm, one full
  // decoder layer, shared_head.norm). The paper shares the embedding and output
  // head with the main model, but the released checkpoint stores a copy of each
  // per module: mtp_checkpoint_copies counts those copies.
  std::int64_t mtp = 0;
  std::int64_t mtp_checkpoint_copies = 0;

  // Per layer.
  std::int64_t num_dense_layers = 0;
  std::int64_t num_moe_layers = 0;
  std::int64_t routed_expert = 0;          // one routed expert
  std::int64_t attention_per_layer = 0;    // one layer's attention block
  std::int64_t dense_layer = 0;            // one dense layer in full; 0 if there are none
  std::int64_t moe_layer_non_expert = 0;   // one MoE layer minus its routed experts; 0 if dense
  std::int64_t moe_layer = 0;              // one MoE layer in full; 0 if dense
};

// Validates the config, then counts. Throws InvalidArgument on an invalid config.
ParamCount count_params(const ModelConfig& config);

}  // namespace peakbound
