// Typed access to the fields of a Hugging Face config.json: required or
// defaulted integers, booleans, strings and lists, where every error names the
// source, the field and the model_type, so the user knows what to fix.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace peakbound {

class HfFields {
 public:
  // `note` is appended to the model_type in errors ("read with generic field names").
  HfFields(const nlohmann::json& config, std::string source, std::string model_type,
           std::string note = "");

  const std::string& model_type() const { return model_type_; }

  // Throws InvalidArgument: "<source>: <what> (model_type <type>[, <note>])".
  [[noreturn]] void fail(const std::string& what) const;
  [[noreturn]] void missing(const std::string& key) const;

  // A key holding null counts as absent, as transformers treats it.
  bool has(const char* key) const;
  bool has_any(std::initializer_list<const char*> keys) const;
  // The key exists, even if null.
  bool present(const char* key) const;

  // Integers must be non-negative; 7168.0 reads as 7168.
  std::int64_t integer(const char* key) const;
  std::int64_t integer_or(const char* key, std::int64_t fallback) const;
  // The first present of several names for one field; all present must agree.
  std::int64_t integer_any(std::initializer_list<const char*> keys) const;

  bool boolean_or(const char* key, bool fallback) const;
  // A number (integer or real) or the fallback when absent or null; anything else fails.
  double number_or(const char* key, double fallback) const;
  std::string string_or(const char* key, const std::string& fallback) const;
  std::vector<std::int64_t> int_list_or_empty(const char* key) const;
  std::vector<std::string> string_list_or_empty(const char* key) const;

 private:
  std::int64_t to_int(const char* key, const nlohmann::json& v) const;

  const nlohmann::json& j_;
  std::string source_;
  std::string model_type_;
  std::string note_;
};

}  // namespace peakbound
