#include "peakbound/cli/config_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "peakbound/core/error.h"

namespace peakbound::cli {

namespace {

// One line (a quoted key or value may hold a newline: peakbound::one_line escapes it).
[[noreturn]] void refuse(const std::string& path, int line, const std::string& what) {
  throw CLI::ConfigError(one_line(path + (line > 0 ? ":" + std::to_string(line) : "") + ": " + what));
}

// The blanks CLI11's TOML reader trims (std::isspace), so that a key this check reads
// is the key CLI11 reads.
constexpr const char* kBlanks = " \t\r\v\f";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(kBlanks);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kBlanks) - b + 1);
}

// A config file holds a few flags: past 64 KiB it is refused, and read no further (a device
// such as /dev/zero never ends; CLI11's TOML reader splits an array in quadratic time, so a
// megabyte array would take minutes).
constexpr std::size_t kMaxConfigBytes = 64 << 10;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) refuse(path, 0, std::string("cannot read the config file (") + std::strerror(errno) + ")");
  std::string text(kMaxConfigBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (f.bad()) refuse(path, 0, "cannot read the config file");
  text.resize(static_cast<std::size_t>(f.gcount()));
  return text;
}

bool is_json(const std::string& path, const std::string& text) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return true;
  const auto b = text.find_first_not_of(" \t\r\n");
  return b != std::string::npos && text[b] == '{';
}

// The text before a '#' that is outside quotes, and whether a '#' sat inside quotes
// (CLI11's reader cuts at any '#', so such a string would silently lose its tail).
std::string strip_comment(const std::string& s, bool& hash_in_string) {
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
      if (c == '#') hash_in_string = true;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return s.substr(0, i);
    }
  }
  return s;
}

std::string unquote(std::string s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) return s.substr(1, s.size() - 2);
  return s;
}

// The line check: every line is blank, a comment, "key = value", or the continuation of
// a multi-line array. Returns each key's line; refuses what CLI11's lenient reader would
// take silently (a line without '=', a table, a dotted or inline-table key).
std::map<std::string, int> check_toml_lines(const std::string& path, const std::string& text) {
  std::map<std::string, int> lines;
  std::istringstream in(text);
  int n = 0, array_from = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++n;
    bool hash_in_string = false;
    const std::string t = trim(strip_comment(raw, hash_in_string));
    if (hash_in_string) refuse(path, n, "'#' inside a string is not supported (CLI11's TOML reader cuts there)");
    if (t.empty() || t.front() == ';') continue;
    if (array_from) {
      if (t.back() == ']') array_from = 0;
      continue;
    }
    if (t.front() == '[')
      refuse(path, n, "tables (" + t + ") are not taken: write each flag as a top-level 'key = value'");
    const auto eq = t.find('=');
    if (eq == std::string::npos) refuse(path, n, "expected 'key = value' (got '" + t + "')");
    const std::string key = unquote(trim(t.substr(0, eq)));
    const std::string value = trim(t.substr(eq + 1));
    if (key.empty() || key.find_first_of(kBlanks) != std::string::npos)
      refuse(path, n, "'" + trim(t.substr(0, eq)) + "' is not a flag name");
    if (key.find('.') != std::string::npos)
      refuse(path, n, "dotted key '" + key + "' (a nested table) is not taken: write the flag's own name");
    if (value.empty()) refuse(path, n, "'" + key + "' has no value");
    if (value.front() == '{') refuse(path, n, "'" + key + "' is an inline table: nested tables are not taken");
    if ((value.front() == '"' || value.front() == '\'') && (value.size() < 2 || value.back() != value.front()))
      refuse(path, n, "'" + key + "': unterminated string");
    if (value.front() == '[' && value.back() != ']') array_from = n;
    if (value.front() == '[' && value.find('{') != std::string::npos)
      refuse(path, n, "'" + key + "' holds an inline table: nested tables are not taken");
    auto [it, fresh] = lines.emplace(key, n);
    if (!fresh) refuse(path, n, "'" + key + "' given twice (first on line " + std::to_string(it->second) + ")");
  }
  if (array_from) refuse(path, array_from, "unterminated array");
  return lines;
}

std::vector<ConfigEntry> read_toml(const std::string& path, const std::string& text) {
  const std::map<std::string, int> lines = check_toml_lines(path, text);
  std::istringstream in(text);
  std::vector<ConfigEntry> out;
  for (CLI::ConfigItem& item : CLI::ConfigTOML().from_config(in)) {
    if (!item.parents.empty()) refuse(path, 0, "'" + item.fullname() + "' is nested: tables are not taken");
    const auto it = lines.find(item.name);
    out.push_back({item.name, std::move(item.inputs), it == lines.end() ? 0 : it->second});
  }
  return out;
}

std::string scalar_text(const std::string& path, const std::string& key, const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_float()) return v.dump();  // shortest text that reads back the same double
  if (v.is_object()) refuse(path, 0, "'" + key + "' is an object: nested objects are not taken");
  if (v.is_array()) refuse(path, 0, "'" + key + "' holds an array inside an array");
  refuse(path, 0, "'" + key + "' is null: leave the key out to keep the flag's default");
}

std::vector<ConfigEntry> read_json(const std::string& path, const std::string& text) {
  nlohmann::ordered_json j;
  std::map<std::string, int> seen;  // top-level keys: nlohmann would keep one of a pair silently
  auto no_duplicates = [&](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && seen[parsed.get<std::string>()]++ > 0)
      refuse(path, 0, "'" + parsed.get<std::string>() + "' given twice");
    return true;
  };
  try {
    j = nlohmann::ordered_json::parse(text, no_duplicates);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number past double's range
    std::string what = e.what();
    const auto p = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && p != std::string::npos) what = what.substr(p + 2);
    refuse(path, 0, "malformed JSON: " + what);
  }
  if (!j.is_object()) refuse(path, 0, "a JSON config file must be one object of flag names to values");
  std::vector<ConfigEntry> out;
  for (const auto& [key, v] : j.items()) {
    ConfigEntry e{key, {}, 0};
    if (v.is_array()) {
      for (const auto& x : v) e.values.push_back(scalar_text(path, key, x));
    } else {
      e.values.push_back(scalar_text(path, key, v));
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<ConfigEntry> parse_config_text(const std::string& path, const std::string& text) {
  if (text.size() > kMaxConfigBytes) refuse(path, 0, "larger than 64 KiB: a config file holds a few flags");
  return is_json(path, text) ? read_json(path, text) : read_toml(path, text);
}

std::vector<ConfigEntry> read_config_file(const std::string& path) { return parse_config_text(path, read_text(path)); }

void apply_config(CLI::App* app, const std::string& path, const std::vector<ConfigEntry>& entries) {
  for (const ConfigEntry& e : entries) {
    if (e.key == "config") refuse(path, e.line, "'config' cannot be set inside a config file");
    CLI::Option* op = app->get_option_no_throw("--" + e.key);
    if (op == nullptr || op == app->get_help_ptr() || op == app->get_help_all_ptr() || !op->get_configurable())
      refuse(path, e.line, "unknown key '" + e.key + "' (not a flag of '" + app->get_name() + "')");
    if (op->count() > 0) continue;  // the command line wins
    if (e.values.empty()) refuse(path, e.line, "'" + e.key + "' has no value");
    try {
      if (op->get_expected_min() == 0) {  // a switch
        if (e.values.size() != 1) refuse(path, e.line, "'" + e.key + "' is a switch: give true or false");
        op->add_result(op->get_flag_value(e.key, e.values.front()));
      } else {
        if (static_cast<int>(e.values.size()) > op->get_items_expected_max())
          refuse(path, e.line, "'" + e.key + "' takes one value (got " + std::to_string(e.values.size()) + ")");
        op->add_result(e.values);
      }
      op->run_callback();
    } catch (const CLI::ConfigError&) {
      throw;
    } catch (const CLI::Error& x) {
      refuse(path, e.line, x.what());
    }
  }
}

CLI::Option* add_config_flag(CLI::App* app) {
  auto* o = app->add_option_function<std::string>(
      "--config",
      [app](const std::string& path) {
        if (trim(path).empty()) throw CLI::ValidationError("--config must not be empty");
        // --help wins over a bad file, as with CLI11's own config files (help comes after callbacks).
        if (app->get_help_ptr() != nullptr && app->get_help_ptr()->count() > 0) return;
        apply_config(app, path, read_config_file(path));
      },
      "Read flags from a TOML or JSON file (keys: flag names without dashes); the command line overrides it");
  o->type_name("FILE")->configurable(false);
  return o;
}

}  // namespace peakbound::cli
