// `peakbound export --checkpoint DIR --hf OUT [--dtype bf16|f32]`: a training checkpoint
// (train/run_checkpoint.h) as a Hugging Face model directory, config.json +
// model.safetensors, that transformers' from_pretrained loads (and `--model OUT` starts a
// run from). The weights are written in --dtype (bf16 rounded to nearest even from the
// fp32 master weights); by default in the dtype of the Hugging Face model the run started from.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/io/path_check.h"
#include "peakbound/train/run_checkpoint.h"

namespace peakbound::cli {

namespace {

struct ExportFlags {
  std::string checkpoint, hf, dtype;
};

std::optional<DType> export_dtype(const std::string& flag) {
  if (flag.empty()) return std::nullopt;
  return shard_dtype(flag, "--dtype");
}

Command add_export(CLI::App& parent) {
  auto f = std::make_shared<ExportFlags>();
  Command cmd;
  CLI::App* app = parent.add_subcommand(
      "export", "Write a training checkpoint as a Hugging Face model directory (config.json + model.safetensors)");
  cmd.app = app;
  text_flag(app, "--checkpoint", f->checkpoint, "A --save-dir folder (its latest checkpoint) or a step folder")
      ->required();
  text_flag(app, "--hf", f->hf, "The folder to write (created if needed)")->required();
  text_flag(app, "--dtype", f->dtype,
            "bf16 or f32: the weights' dtype in model.safetensors (bf16 rounds the fp32 master weights to nearest "
            "even); default: the torch_dtype of the Hugging Face model the run started from");
  cmd.validate = [f] {
    (void)export_dtype(f->dtype);
    const std::string step = resolve_checkpoint(f->checkpoint);
    (void)read_checkpoint_manifest(step);
    // --hf: a folder (made if absent), not the checkpoint's own, and its two files
    // regular ones where they exist (the atomic writer would replace a device or FIFO).
    std::error_code ec;
    if (std::filesystem::exists(f->hf, ec)) {
      require_input_dir(f->hf, "--hf", "a folder to write the model into");
      if (same_file(f->hf, step))
        throw InvalidArgument("--hf '" + f->hf + "' is the checkpoint's own folder ('" + step +
                              "'): give a new folder for the exported model");
      for (const char* name : {"config.json", "model.safetensors"}) {
        const std::string file = (std::filesystem::path(f->hf) / name).string();
        if (std::filesystem::exists(std::filesystem::symlink_status(file, ec))) require_output_file(file, "--hf");
      }
    }
  };
  cmd.run = [f] {
    const std::string step = resolve_checkpoint(f->checkpoint);
    const DType written = export_hf(step, f->hf, export_dtype(f->dtype));
    std::printf("exported %s to %s (config.json, model.safetensors in %s)\n", step.c_str(), f->hf.c_str(),
                std::string(dtype_name(written)).c_str());
    return 0;
  };
  return cmd;
}

const bool registered = register_command("", "export", add_export);

}  // namespace

}  // namespace peakbound::cli
