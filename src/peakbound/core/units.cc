#include "peakbound/core/units.h"

#include <cctype>
#include <charconv>
#include <limits>
#include <stdexcept>
#include <cmath>
#include <cstdio>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "1.5 GiB" -> the number's text "1.5" and the lower-case suffix "gib".
void split_number(std::string_view text, std::string& number, std::string& suffix, std::string_view what) {
  std::string s(text);
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::size_t start = i;
  // "-1", "-1GiB": a sign before a number is a negative size, not "not a number".
  if (i + 1 < s.size() && s[i] == '-' && (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '.'))
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is negative (sizes and counts cannot be negative)");
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == start)
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
  number = s.substr(start, i - start);
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::size_t end = s.size();
  while (end > i && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  suffix = lower(std::string_view(s).substr(i, end - i));
}

[[noreturn]] void out_of_range(std::string_view text, std::string_view what) {
  throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is out of range (at most 2^63 - 1)");
}

// number x mult, exactly when the number is whole (no rounding through a double), and
// never past 2^63 - 1, so every size also fits a signed 64-bit count.
std::uint64_t scaled(const std::string& number, std::uint64_t mult, std::string_view text, std::string_view what,
                     bool whole_only) {
  constexpr std::uint64_t kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (number.find('.') == std::string::npos) {
    std::uint64_t v = 0, r = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec == std::errc::result_out_of_range || __builtin_mul_overflow(v, mult, &r) || r > kMax) out_of_range(text, what);
    if (ec != std::errc() || end != number.data() + number.size())
      throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
    return r;
  }
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(number, &used);
    if (used != number.size()) throw std::invalid_argument("partial");
  } catch (const std::out_of_range&) {
    out_of_range(text, what);
  } catch (const std::exception&) {
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
  }
  const double n = v * static_cast<double>(mult);
  if (!(n >= 0) || n >= 9.2e18) out_of_range(text, what);
  if (whole_only && n != std::floor(n))
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a whole number");
  return static_cast<std::uint64_t>(std::llround(n));
}

}  // namespace

std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  std::string number, suffix;
  split_number(text, number, suffix, what);
  std::uint64_t mult = 0;
  if (suffix.empty() || suffix == "b") mult = 1;
  else if (suffix == "k" || suffix == "kib") mult = 1ull << 10;
  else if (suffix == "m" || suffix == "mib") mult = 1ull << 20;
  else if (suffix == "g" || suffix == "gib") mult = 1ull << 30;
  else if (suffix == "t" || suffix == "tib") mult = 1ull << 40;
  else if (suffix == "kb") mult = 1000ull;
  else if (suffix == "mb") mult = 1000000ull;
  else if (suffix == "gb") mult = 1000000000ull;
  else if (suffix == "tb") mult = 1000000000000ull;
  else
    throw InvalidArgument(std::string(what) + ": unknown unit '" + suffix + "' in '" +
                          std::string(text) + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  return scaled(number, mult, text, what, false);
}

std::uint64_t parse_count(std::string_view text, std::string_view what) {
  std::string number, suffix;
  split_number(text, number, suffix, what);
  std::uint64_t mult = 0;
  if (suffix.empty()) mult = 1;
  else if (suffix == "k") mult = 1ull << 10;
  else if (suffix == "m") mult = 1ull << 20;
  else if (suffix == "g") mult = 1ull << 30;
  else
    throw InvalidArgument(std::string(what) + ": unknown suffix '" + suffix + "' in '" +
                          std::string(text) + "' (use K, M or G, powers of 1024)");
  return scaled(number, mult, text, what, true);
}

std::string format_count(std::uint64_t n) {
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

}  // namespace peakbound
