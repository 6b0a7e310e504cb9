// CLI subcommands register themselves: each lives in its own file and, at static
// initialisation, calls register_command() with its parent ("" for top level,
// "bench" or "verify" for a case of those groups). Adding a benchmark is adding a
// file; nothing else in the CLI changes. (The CLI's sources are linked into the
// executable directly, so these registrations are never dropped by the linker.)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "peakbound/core/launcher.h"

namespace peakbound::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the exit code
  // Collective commands run on every rank of an mpirun job. The others are one-process
  // commands: under mpirun only the launcher's rank 0 runs them (the rest exit 0), so the
  // output is one report (one valid JSON object), not one per rank.
  bool collective = false;
  // Checks that need no communication, run on every rank before `run`. Every rank reaches
  // the same verdict (same flags, same files, same launcher size), so a failure here is
  // printed once, by rank 0, and every rank exits non-zero without aborting the job.
  std::function<void()> validate;
};


using AddCommand = Command (*)(CLI::App& parent);

// Returns true, so a file can write `const bool registered = register_command(...);`.
bool register_command(const char* parent, const char* name, AddCommand add);

// Builds every registered command under `root` (and the groups bench and verify),
// sorted by name; returns them all with their actions.
std::vector<Command> build_commands(CLI::App& root);

// One place for the build description printed by --version and `info`.
std::string build_description();

}  // namespace peakbound::cli
