#include "peakbound/cli/config_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

// toml++ header-only (the parser is compiled here, with this build's flags and sanitizers).
#define TOML_HEADER_ONLY 1
#define TOML_ENABLE_FORMATTERS 0
#include <toml++/toml.h>

#include "peakbound/core/error.h"

namespace peakbound::cli {

namespace {

// One line (a quoted key or value may hold a newline: peakbound::one_line escapes it).
[[noreturn]] void refuse(const std::string& path, int line, const std::string& what) {
  throw CLI::ConfigError(one_line(path + (line > 0 ? ":" + std::to_string(line) : "") + ": " + what));
}

std::string trim(const std::string& s) {
  constexpr const char* kBlanks = " \t\r\v\f";
  const auto b = s.find_first_not_of(kBlanks);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kBlanks) - b + 1);
}

// A config file holds a few flags: past 64 KiB it is refused, and read no further.
constexpr std::size_t kMaxConfigBytes = 64 << 10;

// What a path that is not a regular file is, for the error (nothing is opened: a FIFO
// would block in open until a writer came, a device may never end).
std::string file_kind(const std::filesystem::file_status& st) {
  namespace fs = std::filesystem;
  switch (st.type()) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    default: return "not a file";
  }
}

std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows a symbolic link
  if (ec && ec != std::errc::no_such_file_or_directory)
    refuse(path, 0, "cannot read the config file (" + ec.message() + ")");
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    const std::string kind = file_kind(st);
    throw CLI::ConfigError(one_line("--config " + path +
                                    (fs::is_directory(st) ? " is a directory, not a config file"
                                                          : " is not a regular file (" + kind + ")")));
  }
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

// Line `n` (1-based) of `text`, trimmed.
std::string line_of(const std::string& text, std::uint32_t n) {
  std::size_t b = 0;
  for (std::uint32_t i = 1; i < n && b != std::string::npos; ++i) {
    b = text.find('\n', b);
    if (b != std::string::npos) ++b;
  }
  if (b == std::string::npos || b > text.size()) return "";
  const std::size_t e = text.find('\n', b);
  return trim(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
}

// Shortest text that reads back the same double ("inf", "nan" as the flag parsers spell them).
std::string real_text(double d) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

// One TOML value as the command line would give it; `key` and `line` for errors.
std::string toml_scalar(const std::string& path, const std::string& key, int line, const toml::node& v) {
  if (const auto* s = v.as_string()) return s->get();
  if (const auto* i = v.as_integer()) return std::to_string(i->get());
  if (const auto* d = v.as_floating_point()) return real_text(d->get());
  if (const auto* b = v.as_boolean()) return b->get() ? "true" : "false";
  if (v.is_array()) refuse(path, line, "'" + key + "' holds an array inside an array");
  if (v.is_table()) refuse(path, line, "'" + key + "' holds a table: nested tables are not taken");
  refuse(path, line, "'" + key + "' holds a date or time, which no flag takes: quote it as a string");
}

// The line of the first non-ASCII byte outside a string or comment, or 0. TOML allows
// none there, and toml++ 3.3 reaches __builtin_unreachable (undefined behaviour) on some
// (U+00A1..U+0499 and others, in is_non_ascii_horizontal_whitespace), so such a file is
// refused before toml++ sees it. Strings: "..." and '...' end at their quote or the line's
// end, """...""" and '''...''' at three quotes (up to two more belong to the string).
int non_ascii_outside_strings(const std::string& t) {
  int line = 1;
  std::size_t i = t.rfind("\xef\xbb\xbf", 0) == 0 ? 3 : 0;  // a UTF-8 byte-order mark, which toml++ skips
  const std::size_t n = t.size();
  auto run = [&](std::size_t at, char q) {
    std::size_t k = at;
    while (k < n && t[k] == q) ++k;
    return k - at;
  };
  while (i < n) {
    const char c = t[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      return line;
    } else if (c == '#') {
      while (i < n && t[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool basic = c == '"';
      if (run(i, c) >= 3) {  // multi-line: to the first run of three quotes, which takes up to five
        i += 3;
        while (i < n) {
          if (basic && t[i] == '\\') {
            if (i + 1 < n && t[i + 1] == '\n') ++line;
            i += 2;
          } else if (t[i] == c && run(i, c) >= 3) {
            i += std::min<std::size_t>(run(i, c), 5);
            break;
          } else {
            if (t[i] == '\n') ++line;
            ++i;
          }
        }
      } else {
        ++i;
        while (i < n && t[i] != c && t[i] != '\n') i += (basic && t[i] == '\\' && i + 1 < n && t[i + 1] != '\n') ? 2 : 1;
        if (i < n && t[i] == c) ++i;
      }
    } else {
      ++i;
    }
  }
  return 0;
}

// TOML by toml++ (TOML 1.0: multi-line and literal strings, escapes, comments anywhere
// outside strings). Only top-level keys are flags: a [table], a dotted key or an inline
// table is refused rather than flattened.
std::vector<ConfigEntry> read_toml(const std::string& path, const std::string& text) {
  if (const int bad = non_ascii_outside_strings(text))
    refuse(path, bad, "malformed TOML: a non-ASCII character outside a string or comment");
  toml::table doc;
  try {
    doc = toml::parse(std::string_view(text), path);
  } catch (const toml::parse_error& e) {
    const int line = static_cast<int>(std::min<std::uint32_t>(e.source().begin.line, 1u << 30));
    refuse(path, line, "malformed TOML: " + std::string(e.description()));
  }
  std::vector<ConfigEntry> out;
  for (const auto& [k, v] : doc) {
    const std::string key(k.str());
    const int line = static_cast<int>(std::min<std::uint32_t>(k.source().begin.line, 1u << 30));
    if (const toml::table* t = v.as_table()) {
      if (t->is_inline()) refuse(path, line, "'" + key + "' is an inline table: nested tables are not taken");
      const std::string where = line_of(text, static_cast<std::uint32_t>(line));
      if (!where.empty() && where.front() == '[')
        refuse(path, line, "tables (" + where + ") are not taken: write each flag as a top-level 'key = value'");
      std::string dotted = key;
      if (!t->empty()) dotted += "." + std::string(t->begin()->first.str());
      refuse(path, line, "dotted key '" + dotted + "' (a nested table) is not taken: write the flag's own name");
    }
    ConfigEntry e{key, {}, line};
    if (const toml::array* a = v.as_array()) {
      for (const toml::node& x : *a) e.values.push_back(toml_scalar(path, key, line, x));
    } else {
      e.values.push_back(toml_scalar(path, key, line, v));
    }
    out.push_back(std::move(e));
  }
  // toml::table orders keys by name: apply (and report) them in the file's order.
  std::stable_sort(out.begin(), out.end(), [](const ConfigEntry& a, const ConfigEntry& b) { return a.line < b.line; });
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
