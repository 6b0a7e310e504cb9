// The command registry and the bench and verify groups.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "peakbound/cli/command.h"

namespace peakbound::cli {

namespace {

struct Entry {
  std::string parent, name;
  AddCommand add;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

Command not_yet(CLI::App& parent, const std::string& name, const std::string& help) {
  Command c;
  c.app = parent.add_subcommand(name, help + " (not yet available)");
  c.app->allow_extras();
  c.run = [name] {
    std::fprintf(stderr, "peakbound: error: '%s' is not yet available in this version\n", name.c_str());
    return 2;
  };
  return c;
}

}  // namespace

bool register_command(const char* parent, const char* name, AddCommand add) {
  registry().push_back({parent, name, add});
  return true;
}

std::vector<Command> build_commands(CLI::App& root) {
  std::vector<Entry> entries = registry();
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.parent + "/" + a.name < b.parent + "/" + b.name; });
  std::vector<Command> out;
  for (const Entry& e : entries)
    if (e.parent.empty()) out.push_back(e.add(root));

  struct Group {
    const char* name;
    const char* help;
  };
  for (Group g : {Group{"bench", "Benchmarks: each schedule beside its baseline on the same inputs, one JSON object per run"},
                  Group{"verify", "Exactness of a schedule against its baseline and a naive reference on given shapes"}}) {
    bool any = std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.parent == g.name; });
    if (!any) {
      out.push_back(not_yet(root, g.name, g.help));
      continue;
    }
    CLI::App* group = root.add_subcommand(g.name, g.help);
    group->require_subcommand(1);
    for (const Entry& e : entries)
      if (e.parent == g.name) out.push_back(e.add(*group));
  }
  return out;
}

}  // namespace peakbound::cli
