// Built-in models by name: the published MoE models peakbound plans for, with
// the shapes of their Hugging Face config.json, and the small models it trains
// on CPU. Each published preset carries the figures its authors published, so
// tests and the CLI can set the computed counts beside them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/model/model_config.h"
#include "peakbound/model/param_count.h"

namespace peakbound {

// Which of ParamCount's active figures the authors' published number means.
enum class ActiveConvention : std::uint8_t {
  with_embedding,     // ParamCount::active (Qwen, Mistral)
  without_embedding,  // ParamCount::active_non_embedding (DeepSeek, OpenAI)
};

// A named config plus the published figures; 0 = not published (own models).
struct Preset {
  ModelConfig config;
  double published_total = 0;           // parameters, excluding MTP
  double published_active = 0;          // parameters per token
  ActiveConvention active_convention = ActiveConvention::with_embedding;
  double published_total_with_mtp = 0;  // DeepSeek-V3: 685B as released
  std::string source;                   // where the figures come from

  // The computed active figure under the convention the authors used.
  std::int64_t comparable_active(const ParamCount& count) const;
};

// Names in a fixed order: published models first, then the CPU-sized ones.
std::vector<std::string> preset_names();

// Throws InvalidArgument listing the valid names when `name` is unknown.
const Preset& find_preset(std::string_view name);
ModelConfig preset_config(std::string_view name);

}  // namespace peakbound
