// Flags shared by `verify attention` and `bench attention`: comma-separated integer
// lists (--lengths, --head-ratios, --windows, --cp-sizes), each item parsed exactly
// (core/values.h) with a one-line error naming the flag.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/values.h"

namespace peakbound::cli {

// "1,2,4" -> {1, 2, 4}; every item in [lo, hi]; empty items refused.
inline std::vector<std::int64_t> int_list(const std::string& text, const std::string& flag, std::int64_t lo,
                                          std::int64_t hi) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_int(item, flag + " item", lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace peakbound::cli
