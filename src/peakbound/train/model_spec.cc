#include "peakbound/train/model_spec.h"

#include <filesystem>

#include "peakbound/core/error.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/presets.h"

namespace peakbound {

bool model_is_path(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  return spec.find('/') != std::string::npos || fs::exists(fs::symlink_status(spec, ec));
}

ModelConfig load_model_spec(const std::string& spec) {
  return model_is_path(spec) ? load_hf_config(spec) : preset_config(spec);
}

ParallelLayout resolve_layout(std::int64_t ep, std::int64_t vocab_group, std::int64_t cp, const ModelConfig& c,
                              std::int64_t world) {
  ParallelLayout l;
  l.cp = cp;
  l.vocab = vocab_group > 0 ? vocab_group : world;
  if (ep > 0) {
    l.ep = ep;
  } else {
    l.ep = world;
    while (l.ep > 1 && (world % l.ep != 0 || (c.num_experts > 0 && c.num_experts % l.ep != 0))) --l.ep;
  }
  validate_layout(l, world);
  if (c.num_experts > 0 && c.num_experts % l.ep != 0)
    throw InvalidArgument("--ep " + std::to_string(l.ep) + " must divide the model's " +
                          std::to_string(c.num_experts) + " experts");
  return l;
}

}  // namespace peakbound
