// train, bench, verify: listed now so --help shows the whole tool; each says
// it is not yet available (exit 2) until its issue lands.
#include <cstdio>
#include <string>

#include "peakbound/cli/command.h"

namespace peakbound::cli {

std::vector<Command> add_pending_commands(CLI::App& root) {
  struct Spec {
    const char* name;
    const char* help;
  };
  const Spec specs[] = {
      {"train", "Train a Mixture-of-Experts model with the four peak-bounding schedules"},
      {"bench", "Benchmarks: each schedule beside its baseline, one JSON object per run"},
      {"verify", "Exactness of each schedule against its baseline and a naive reference"},
  };
  std::vector<Command> out;
  for (const Spec& s : specs) {
    Command c;
    c.app = root.add_subcommand(s.name, std::string(s.help) + " (not yet available)");
    c.app->allow_extras();
    std::string name = s.name;
    c.run = [name] {
      std::fprintf(stderr, "peakbound: error: '%s' is not yet available in this version\n", name.c_str());
      return 2;
    };
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace peakbound::cli
