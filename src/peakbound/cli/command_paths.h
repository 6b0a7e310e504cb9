// The files a command reads and writes, checked together before anything is opened for
// writing (io/path_check.h): every input a regular file, every output absent or a regular
// file, no output the same file as an input or as another output. The inputs include the
// --config file and, when --model is a Hugging Face folder, its config.json and weights;
// --memory-timeline stands for the file each rank writes (t.json -> t.rank-R.json).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "peakbound/io/path_check.h"

namespace peakbound::cli {

struct CommandPaths {
  std::vector<FlagPath> inputs;   // files read (entries with an empty path are skipped)
  std::string model;              // --model: when a path, the files read from it are inputs
  std::string checkpoint;         // --resume: the files of the checkpoint it names are inputs
  std::vector<FlagPath> outputs;  // files written (empty: skipped)
  std::string memory_timeline;    // --memory-timeline: one file per rank of `world` (empty: none)
  int world = 1;
};

// Throws InvalidArgument naming the flag and the path. `app` (may be null) supplies --config.
void check_command_paths(const CLI::App* app, const CommandPaths& paths);

// The files read from a --model that is a path: the config.json and the weight files
// (model.safetensors, or the index and its shards) that exist; empty for a preset.
std::vector<FlagPath> model_input_files(const std::string& model);

}  // namespace peakbound::cli
