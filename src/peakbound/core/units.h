// Human-readable sizes and counts: "80GiB", "141 GiB", "1.5TB", "128K", "1M".
// Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB,
// GB, TB) powers of 1000. Token counts ("128K", "1M") are powers of 1024, since
// context lengths are quoted that way (1M context = 1048576 tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace peakbound {

// "1.50 GiB", "256 B", "3.00 MiB". Always binary units.
std::string format_bytes(double bytes);

// Parses a byte size; throws InvalidArgument naming `what` on bad input.
std::uint64_t parse_bytes(std::string_view text, std::string_view what = "size");

// Parses a count with optional K/M/G suffix (x1024); "1048576", "128K", "1M".
std::uint64_t parse_count(std::string_view text, std::string_view what = "count");

// "1M" for 1048576, "96K" for 98304, "1000" otherwise.
std::string format_count(std::uint64_t n);

}  // namespace peakbound
