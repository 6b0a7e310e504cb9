// Fuzz target: the size and count parsers (core/units.h), "12GiB", "1.5 TB", "128K". On
// success the value fits a signed 64-bit count and reads back through its own text.
#include <cstdint>
#include <string>
#include <string_view>

#include "peakbound/core/units.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_ours([&] {
    const std::uint64_t b = parse_bytes(text, "--device-memory");
    FUZZ_CHECK(b <= static_cast<std::uint64_t>(INT64_MAX));
    FUZZ_CHECK(parse_bytes(std::to_string(b) + " B") == b);
    (void)format_bytes(static_cast<double>(b));
  });
  fuzz::expect_ours([&] {
    const std::uint64_t n = parse_count(text, "--context");
    FUZZ_CHECK(n <= static_cast<std::uint64_t>(INT64_MAX));
    FUZZ_CHECK(parse_count(format_count(n)) == n);
  });
  return 0;
}
