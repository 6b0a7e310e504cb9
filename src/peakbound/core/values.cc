#include "peakbound/core/values.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

[[noreturn]] void bad_int(std::string_view text, std::string_view what, std::int64_t lo, std::int64_t hi) {
  throw InvalidArgument(std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "] (got '" + std::string(text) + "')");
}

[[noreturn]] void bad_real(std::string_view text, std::string_view what, double lo, double hi) {
  throw InvalidArgument(std::string(what) + " must be a finite number in [" + num(lo) + ", " + num(hi) +
                        "] (got '" + std::string(text) + "')");
}

}  // namespace

std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t lo, std::int64_t hi) {
  std::string_view t = trim(text);
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v < lo || v > hi) bad_int(text, what, lo, hi);
  return v;
}

double parse_real(std::string_view text, std::string_view what, double lo, double hi) {
  std::string t(trim(text));
  if (t.empty()) bad_real(text, what, lo, hi);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v) || v < lo || v > hi) bad_real(text, what, lo, hi);
  return v;
}

std::int64_t check_int(std::int64_t v, std::string_view what, std::int64_t lo, std::int64_t hi) {
  if (v < lo || v > hi) bad_int(std::to_string(v), what, lo, hi);
  return v;
}

double check_real(double v, std::string_view what, double lo, double hi) {
  if (!std::isfinite(v) || v < lo || v > hi) bad_real(num(v), what, lo, hi);
  return v;
}

}  // namespace peakbound
