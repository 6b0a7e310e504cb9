// `--config FILE` on a command: its flags read from a TOML or JSON file. Keys are the
// command's long flag names without the dashes ("steps = 20", "schedules = \"all\"",
// "device-memory = \"512MiB\"", "reach = true" for a switch); values are scalars,
// strings, or arrays where a flag takes several. The file is JSON when its name ends in
// .json or its first non-space character is '{', TOML 1.0 otherwise (read by toml++:
// basic, literal and multi-line strings with their escapes, integers in any base,
// comments after values).
//
// Semantics are CLI11's config semantics: a flag given on the command line wins over
// the file (the file's value is not parsed at all then); a value from the file goes
// through the flag's own parser, so an out-of-range value is refused with the flag's own
// message. Refused, each as one line naming the file (and the line for TOML): a missing
// or unreadable file, a path that is not a regular file (a directory, a FIFO, a device:
// never opened), malformed TOML (toml++'s message: a key given twice among them) or JSON,
// an unknown key, a nested table or object (TOML "[section]", dotted "a.b" keys, inline
// tables, JSON objects: nothing is flattened), a date or time value, an array to a
// one-value flag, "config"/"help" as keys, and a file over 64 KiB.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace peakbound::cli {

// One key of a config file: its values as the command line would give them ("true" /
// "false" for booleans, numbers in their shortest round-trip text), and its line (0 when
// the format does not say: JSON).
struct ConfigEntry {
  std::string key;
  std::vector<std::string> values;
  int line = 0;
};

// Reads a config file (format detected as above). Throws CLI::ConfigError, one line
// naming the file, when it cannot be read or is malformed or nested.
std::vector<ConfigEntry> read_config_file(const std::string& path);

// The same on the file's text already read: `path` names it in errors and, by a .json
// ending, chooses JSON.
std::vector<ConfigEntry> parse_config_text(const std::string& path, const std::string& text);

// Applies the entries to `app`'s options that the command line left unset, running each
// option's own parser. Throws CLI::ConfigError naming the file (and line) for an unknown
// key or a value the flag refuses.
void apply_config(CLI::App* app, const std::string& path, const std::vector<ConfigEntry>& entries);

// Adds `--config FILE` to `app` (a command): the file is read and applied after the
// command line is parsed, before the command's validation and run. Returns the option.
CLI::Option* add_config_flag(CLI::App* app);

}  // namespace peakbound::cli
