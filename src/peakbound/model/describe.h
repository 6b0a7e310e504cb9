// Model configs and parameter counts as JSON (for `--json` output and run
// records) and as one human-readable line (for the CLI).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/model/model_config.h"
#include "peakbound/model/param_count.h"

namespace peakbound {

// Every ModelConfig field under its own name, plus "num_moe_layers".
nlohmann::json to_json(const ModelConfig& config);

// Every ParamCount field under its own name.
nlohmann::json to_json(const ParamCount& count);

// "671.03B", "19.28M", "5.1K", "512": decimal, as parameter counts are quoted.
std::string format_params(std::int64_t n);

// e.g. "deepseek-v3 (deepseek_v3): 61 layers (3 dense, 58 MoE), hidden 7168,
// vocab 129280, MLA 128 heads, 256 experts top-8 + 1 shared; 671.03B params,
// 37.55B active". Validates the config.
std::string summary(const ModelConfig& config);

}  // namespace peakbound
