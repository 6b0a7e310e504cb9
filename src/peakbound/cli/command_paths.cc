#include "peakbound/cli/command_paths.h"

#include <filesystem>

#include "peakbound/train/model_spec.h"
#include "peakbound/core/error.h"
#include "peakbound/io/memory_timeline_file.h"
#include "peakbound/train/hf_checkpoint.h"
#include "peakbound/train/run_checkpoint.h"

namespace peakbound::cli {

namespace fs = std::filesystem;

std::vector<FlagPath> model_input_files(const std::string& model) {
  std::vector<FlagPath> out;
  if (model.empty() || !model_is_path(model)) return out;
  std::error_code ec;
  if (!fs::is_directory(model, ec)) {
    out.push_back({"--model", model});  // a config.json named directly
    return out;
  }
  const fs::path dir(model);
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(dir / name, ec)) out.push_back({"--model's " + std::string(name), (dir / name).string()});
  try {
    for (const std::string& shard : hf_weight_files(model)) out.push_back({"--model's weights", shard});
  } catch (const Error&) {
    // A broken index or no weights: the loader names it; the files above are checked.
  }
  return out;
}

void check_command_paths(const CLI::App* app, const CommandPaths& p) {
  std::vector<FlagPath> inputs;
  for (const FlagPath& in : p.inputs)
    if (!in.path.empty()) inputs.push_back(in);
  if (app != nullptr) {
    const CLI::Option* config = app->get_option_no_throw("--config");
    if (config != nullptr && config->count() > 0 && !config->results().empty())
      inputs.push_back({"--config", config->results().back()});
  }
  for (const FlagPath& in : inputs) require_input_file(in.path, in.flag);
  for (const FlagPath& m : model_input_files(p.model)) inputs.push_back(m);
  if (!p.checkpoint.empty()) {
    // The step folder it resolves to (its manifest, weights and optimizer state are mapped
    // while the run loads them); an unusable one is named by the checkpoint's own check.
    try {
      const std::string step = resolve_checkpoint(p.checkpoint);
      std::error_code ec;
      for (const fs::directory_entry& e : fs::directory_iterator(step, ec))
        if (e.is_regular_file(ec)) inputs.push_back({"--resume's checkpoint file", e.path().string()});
    } catch (const Error&) {
    }
  }

  std::vector<FlagPath> outputs;
  for (const FlagPath& o : p.outputs)
    if (!o.path.empty()) outputs.push_back(o);
  if (!p.memory_timeline.empty())
    for (int r = 0; r < p.world; ++r)
      outputs.push_back({"--memory-timeline", memory_timeline_path(p.memory_timeline, r, p.world)});
  for (const FlagPath& o : outputs) require_output_file(o.path, o.flag);
  refuse_same_file(outputs, inputs);
}

}  // namespace peakbound::cli
