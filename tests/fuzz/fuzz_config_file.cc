// Fuzz target: `--config FILE` (cli/config_file.h), TOML (toml++, compiled into the target
// with the fuzzer's coverage) or JSON. The first byte chooses
// the file's name (.json or .toml, which with the text decides the format); the rest is
// the text. Its entries are then applied to a command with one flag of every kind the
// commands use (integer, real, seed, text, switch, list), each through its own parser.
// The documented error is CLI::ConfigError, one line naming the file.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/cli/config_file.h"
#include "peakbound/cli/flags.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string path = (data[0] & 1) ? "fuzz.json" : "fuzz.toml";
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  fuzz::expect_ours<CLI::ConfigError>([&] {
    const std::vector<cli::ConfigEntry> entries = cli::parse_config_text(path, text);
    CLI::App app("fuzz", "train");
    std::int64_t steps = 10;
    int batch = 1;
    double lr = 1e-3;
    std::uint64_t seed = 0;
    std::string model = "tiny", memory = "auto";
    bool json = false;
    std::vector<std::string> ranks;
    cli::int_flag(&app, "--steps", steps, "steps", 1, std::int64_t{1} << 40);
    cli::int_flag(&app, "--batch", batch, "batch", 1, 1 << 20);
    cli::real_flag(&app, "--lr", lr, "lr", 0.0, 10.0);
    cli::seed_flag(&app, "--seed", seed, "seed");
    cli::text_flag(&app, "--model", model, "model");
    cli::text_flag(&app, "--device-memory", memory, "budget");
    app.add_flag("--json", json, "json");
    app.add_option("--ranks", ranks, "a list");
    cli::apply_config(&app, path, entries);
  });
  return 0;
}
