// Numeric flags read through the one validation layer (core/values.h): CLI11's own
// integer and float parsing clamps 99999999999999999999 to the type's maximum, reads
// "" as 0 and lets NaN and infinity through range checks. These options take the text
// and parse it exactly; a bad value is a one-line error naming the flag and its range,
// exit code 2. Each shows its default in --help.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "peakbound/core/dtype.h"

namespace peakbound::cli {

// An integer flag in [lo, hi] into `target` (which holds the default).
CLI::Option* int_flag(CLI::App* app, const std::string& name, std::int64_t& target, const std::string& help,
                      std::int64_t lo, std::int64_t hi);
CLI::Option* int_flag(CLI::App* app, const std::string& name, int& target, const std::string& help, int lo, int hi);
// An integer flag in [lo, hi] with no default: left unset unless given.
CLI::Option* optional_int_flag(CLI::App* app, const std::string& name, std::optional<std::int64_t>& target,
                               const std::string& help, std::int64_t lo, std::int64_t hi);
// A finite real flag in [lo, hi].
CLI::Option* real_flag(CLI::App* app, const std::string& name, double& target, const std::string& help, double lo,
                       double hi);
CLI::Option* real_flag(CLI::App* app, const std::string& name, float& target, const std::string& help, double lo,
                       double hi);
// A seed: any integer in [0, 2^64 - 1] ("-1" is refused, not wrapped).
CLI::Option* seed_flag(CLI::App* app, const std::string& name, std::uint64_t& target, const std::string& help);
// A non-empty string flag ("" is refused: it would silently mean a default).
CLI::Option* text_flag(CLI::App* app, const std::string& name, std::string& target, const std::string& help);

// --device: where a command's work runs, cpu or cuda (make_device; cuda needs a CUDA
// build and a GPU, and says which is missing).
CLI::Option* device_flag(CLI::App* app, std::string& target);

// A shard dtype given to a flag: bf16 or f32, the only ones a parameter or gradient
// shard takes; anything else is "<flag>: 'f16' is not a dtype it takes (use bf16 or f32)".
DType shard_dtype(const std::string& text, const std::string& flag);

}  // namespace peakbound::cli
