// Import of a Hugging Face config.json into a ModelConfig, so any released
// checkpoint's shape can be planned for without a hand-written preset.
//
// Families read by their own field names: deepseek_v3 / deepseek_v2, qwen3_moe /
// qwen2_moe, mixtral, gpt_oss, and dense llama / mistral / qwen2 / qwen3. Any
// other model_type is read with the generic field names (num_local_experts or
// num_experts or n_routed_experts, num_experts_per_tok, moe_intermediate_size,
// kv_lora_rank for MLA...) and fails naming the first required field it lacks.
// rope_theta is read (top level, or rope_parameters.rope_theta as transformers 5
// writes it); other fields that only tune numerics (rope_scaling, eps, dropout,
// quantisation) are ignored.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/model/model_config.h"

namespace peakbound {

// Reads `path` (a config.json, or a folder holding one). The model is named after
// the folder the file sits in. Throws InvalidArgument, naming the path, when the
// file cannot be read, is not JSON, or lacks a required field.
ModelConfig load_hf_config(const std::string& path);

// Parses an already-loaded config.json. Errors read
// "config.json: missing field 'hidden_size' (model_type deepseek_v3)".
ModelConfig parse_hf_config(const nlohmann::json& config, std::string name);

// As parse_hf_config, with `source` (usually the file path) heading each error.
ModelConfig parse_hf_config(const nlohmann::json& config, std::string name,
                            const std::string& source);

}  // namespace peakbound
