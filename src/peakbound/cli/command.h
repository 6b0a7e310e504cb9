// A CLI subcommand: its CLI11 sub-app (flags bound to its options) and the action
// run when it is chosen. Each subcommand lives in its own file and registers here.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace peakbound::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the exit code
};

Command add_demo_command(CLI::App& root);
Command add_info_command(CLI::App& root);
Command add_plan_command(CLI::App& root);
// train, bench, verify until their issues land.
std::vector<Command> add_pending_commands(CLI::App& root);

// One place for the build description printed by --version and `info`.
std::string build_description();

}  // namespace peakbound::cli
