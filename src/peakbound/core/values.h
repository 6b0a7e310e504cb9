// One validation layer for the numbers and sizes users give (flags, config files):
// every command and the config importer read numbers through these, so a value is
// either what the user meant or a one-line InvalidArgument naming it. Never clamped,
// never wrapped, never NaN or infinity, never an empty string read as 0.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

namespace peakbound {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// A whole decimal integer in [lo, hi]: "42", "-1". Rejects empty text, fractions,
// exponents, trailing junk and values outside the range (no clamping):
// "<what> must be an integer in [lo, hi] (got '<text>')".
std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t lo, std::int64_t hi);

// A finite real in [lo, hi]: "0.5", "1e-3". Rejects empty text, NaN, inf and values
// outside the range.
double parse_real(std::string_view text, std::string_view what, double lo, double hi);

// The same checks on a value already read (from JSON, say).
std::int64_t check_int(std::int64_t v, std::string_view what, std::int64_t lo, std::int64_t hi);
double check_real(double v, std::string_view what, double lo, double hi);

}  // namespace peakbound
