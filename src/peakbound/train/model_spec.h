// What every run shares (train/run.h, `eval`, `bench reach`): reading a model spec (a
// preset name or a Hugging Face directory) and resolving the layout (ep, vocab group, cp)
// over the launched ranks. (The sequence length against cp: check_context_split,
// schedules/context_layout.h.)
#pragma once

#include <cstdint>
#include <string>

#include "peakbound/model/model_config.h"
#include "peakbound/train/process_groups.h"

namespace peakbound {

// True when the model spec names a path (a directory with config.json and weights).
bool model_is_path(const std::string& spec);
// The config of a preset or of a Hugging Face directory; InvalidArgument otherwise.
ModelConfig load_model_spec(const std::string& spec);
// ep 0 = the largest divisor of both the rank count and the expert count; vocab 0 =
// every rank; cp as given (consecutive ranks share sequences). Throws InvalidArgument
// naming the flag when a size does not divide.
ParallelLayout resolve_layout(std::int64_t ep, std::int64_t vocab_group, std::int64_t cp, const ModelConfig& c,
                              std::int64_t world);

}  // namespace peakbound
