#include "peakbound/model/hf_fields.h"

#include <algorithm>
#include <limits>

#include "peakbound/core/error.h"

namespace peakbound {

using nlohmann::json;

namespace {

// A value as an error quotes it: a scalar as its JSON text (cut at 80 characters), a list
// or object by its kind only. A nested value is never serialised whole: that would recurse
// once per level (a stack overflow on "[[[[...]]]]") and could copy megabytes into the line.
std::string shown(const json& v) {
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  if (s.size() > 80) {
    std::size_t cut = 77;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 character
    s = s.substr(0, cut) + "...";
  }
  return s;
}

}  // namespace

HfFields::HfFields(const json& config, std::string source, std::string model_type,
                   std::string note)
    : j_(config),
      source_(std::move(source)),
      model_type_(std::move(model_type)),
      note_(std::move(note)) {}

void HfFields::fail(const std::string& what) const {
  std::string where = model_type_.empty() ? "model_type not set" : "model_type " + model_type_;
  if (!note_.empty()) where += ", " + note_;
  throw InvalidArgument(source_ + ": " + what + " (" + where + ")");
}

void HfFields::missing(const std::string& key) const { fail("missing field '" + key + "'"); }

bool HfFields::has(const char* key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

bool HfFields::has_any(std::initializer_list<const char*> keys) const {
  return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return has(k); });
}

bool HfFields::present(const char* key) const { return j_.contains(key); }

std::int64_t HfFields::integer(const char* key) const {
  if (!has(key)) missing(key);
  return to_int(key, j_.at(key));
}

std::int64_t HfFields::integer_or(const char* key, std::int64_t fallback) const {
  return has(key) ? to_int(key, j_.at(key)) : fallback;
}

double HfFields::number_or(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number()) fail("field '" + std::string(key) + "' must be a number, got " + std::string(v.type_name()));
  return v.get<double>();
}

std::int64_t HfFields::integer_any(std::initializer_list<const char*> keys) const {
  const char* found = nullptr;
  std::int64_t value = 0;
  for (const char* key : keys) {
    if (!has(key)) continue;
    const std::int64_t v = to_int(key, j_.at(key));
    if (found && v != value)
      fail("fields '" + std::string(found) + "' (" + std::to_string(value) + ") and '" + key +
           "' (" + std::to_string(v) + ") disagree");
    if (!found) {
      found = key;
      value = v;
    }
  }
  if (!found) {
    std::string names;
    for (const char* key : keys) names += std::string(names.empty() ? "'" : " or '") + key + "'";
    fail("missing field " + names);
  }
  return value;
}

bool HfFields::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  if (!v.is_boolean())
    fail("field '" + std::string(key) + "' must be true or false, got " + shown(v));
  return v.get<bool>();
}

std::string HfFields::string_or(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  if (!v.is_string()) fail("field '" + std::string(key) + "' must be a string, got " + shown(v));
  return v.get<std::string>();
}

std::vector<std::int64_t> HfFields::int_list_or_empty(const char* key) const {
  std::vector<std::int64_t> out;
  if (!has(key)) return out;
  const json& v = j_.at(key);
  if (!v.is_array()) fail("field '" + std::string(key) + "' must be a list, got " + shown(v));
  for (const json& e : v) out.push_back(to_int(key, e));
  return out;
}

std::vector<std::string> HfFields::string_list_or_empty(const char* key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const json& v = j_.at(key);
  if (!v.is_array()) fail("field '" + std::string(key) + "' must be a list, got " + shown(v));
  for (const json& e : v) {
    if (!e.is_string()) fail("field '" + std::string(key) + "' must list strings, got " + shown(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::int64_t HfFields::to_int(const char* key, const json& v) const {
  const std::string bad = "field '" + std::string(key) + "' must be a non-negative integer, got ";
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(bad + shown(v));
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() < 0) fail(bad + shown(v));
    return v.get<std::int64_t>();
  }
  if (v.is_number_float()) {
    // 9e15 < 2^53: every integral double below it converts exactly.
    const double d = v.get<double>();
    if (d >= 0 && d <= 9.0e15 && d == static_cast<double>(static_cast<std::int64_t>(d)))
      return static_cast<std::int64_t>(d);
  }
  fail(bad + shown(v));
}

}  // namespace peakbound
