#include "peakbound/core/units.h"

#include <cctype>
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

// Splits "1.5 GiB" into number 1.5 and suffix "gib"; throws on no number.
double split_number(std::string_view text, std::string& suffix, std::string_view what) {
  std::string s(text);
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::size_t start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == start)
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(s.substr(start, i - start), &used);
    if (used != i - start) throw std::invalid_argument("partial");
  } catch (const std::exception&) {
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
  }
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::size_t end = s.size();
  while (end > i && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  suffix = lower(std::string_view(s).substr(i, end - i));
  return v;
}

std::uint64_t checked(double v, std::string_view text, std::string_view what) {
  if (!(v >= 0) || v > 1.8e19)
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is out of range");
  return static_cast<std::uint64_t>(std::llround(v));
}

}  // namespace

std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  std::string suffix;
  double v = split_number(text, suffix, what);
  double mult = 0;
  if (suffix.empty() || suffix == "b") mult = 1;
  else if (suffix == "k" || suffix == "kib") mult = 1024.0;
  else if (suffix == "m" || suffix == "mib") mult = 1024.0 * 1024;
  else if (suffix == "g" || suffix == "gib") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "t" || suffix == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (suffix == "kb") mult = 1e3;
  else if (suffix == "mb") mult = 1e6;
  else if (suffix == "gb") mult = 1e9;
  else if (suffix == "tb") mult = 1e12;
  else
    throw InvalidArgument(std::string(what) + ": unknown unit '" + suffix + "' in '" +
                          std::string(text) + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  return checked(v * mult, text, what);
}

std::uint64_t parse_count(std::string_view text, std::string_view what) {
  std::string suffix;
  double v = split_number(text, suffix, what);
  double mult = 0;
  if (suffix.empty()) mult = 1;
  else if (suffix == "k") mult = 1024.0;
  else if (suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "g") mult = 1024.0 * 1024 * 1024;
  else
    throw InvalidArgument(std::string(what) + ": unknown suffix '" + suffix + "' in '" +
                          std::string(text) + "' (use K, M or G, powers of 1024)");
  double n = v * mult;
  if (n != std::floor(n))
    throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a whole number");
  return checked(n, text, what);
}

std::string format_count(std::uint64_t n) {
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

}  // namespace peakbound
