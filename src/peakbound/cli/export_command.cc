// `peakbound export --checkpoint DIR --hf OUT`: a training checkpoint (train/run_checkpoint.h)
// as a Hugging Face model directory, config.json + model.safetensors, that transformers'
// from_pretrained loads (and `--model OUT` starts a run from).
#include <cstdio>
#include <memory>
#include <string>

#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/core/error.h"
#include "peakbound/train/run_checkpoint.h"

namespace peakbound::cli {

namespace {

struct ExportFlags {
  std::string checkpoint, hf;
};

Command add_export(CLI::App& parent) {
  auto f = std::make_shared<ExportFlags>();
  Command cmd;
  CLI::App* app = parent.add_subcommand(
      "export", "Write a training checkpoint as a Hugging Face model directory (config.json + model.safetensors)");
  cmd.app = app;
  text_flag(app, "--checkpoint", f->checkpoint, "A --save-dir folder (its latest checkpoint) or a step folder")
      ->required();
  text_flag(app, "--hf", f->hf, "The folder to write (created if needed)")->required();
  cmd.validate = [f] { (void)read_checkpoint_manifest(resolve_checkpoint(f->checkpoint)); };
  cmd.run = [f] {
    const std::string step = resolve_checkpoint(f->checkpoint);
    export_hf(step, f->hf);
    std::printf("exported %s to %s (config.json, model.safetensors)\n", step.c_str(), f->hf.c_str());
    return 0;
  };
  return cmd;
}

const bool registered = register_command("", "export", add_export);

}  // namespace

}  // namespace peakbound::cli
