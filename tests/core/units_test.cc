#include "peakbound/core/units.h"

#include <gtest/gtest.h>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Units, ParsesBinaryAndDecimalSizes) {
  EXPECT_EQ(parse_bytes("80GiB"), 80ull << 30);
  EXPECT_EQ(parse_bytes("141 GiB"), 141ull << 30);
  EXPECT_EQ(parse_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("80GB"), 80000000000ull);
  EXPECT_EQ(parse_bytes("4096"), 4096ull);
  EXPECT_EQ(parse_bytes("2k"), 2048ull);
}

TEST(Units, RejectsBadSizesNamingTheFlag) {
  try {
    parse_bytes("80GiBs", "--device-memory");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--device-memory"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gibs"), std::string::npos);
  }
  EXPECT_THROW(parse_bytes("lots"), InvalidArgument);
  EXPECT_THROW(parse_bytes(""), InvalidArgument);
  EXPECT_THROW(parse_bytes("-5GiB"), InvalidArgument);
  EXPECT_THROW(parse_bytes("1.2.3GiB"), InvalidArgument);
}

// Found by tests/fuzz: the quoted text held a newline, so the error spanned two lines.
// Every peakbound::Error escapes control characters (core/error.h).
TEST(Units, ErrorsQuotingControlCharactersStayOneLine) {
  try {
    parse_bytes("1\nfoo\x01", "--device-memory");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "--device-memory: unknown unit 'foo\\x01' in '1\\nfoo\\x01' "
                                     "(use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  }
  EXPECT_EQ(one_line("a\tb\r\n\x7f"), "a\\tb\\r\\n\\x7f");
  EXPECT_EQ(one_line("plain 'text' \xc3\xa9"), "plain 'text' \xc3\xa9");  // UTF-8 kept
}

TEST(Units, ParsesTokenCounts) {
  EXPECT_EQ(parse_count("1M"), 1048576ull);
  EXPECT_EQ(parse_count("128K"), 131072ull);
  EXPECT_EQ(parse_count("1048576"), 1048576ull);
  EXPECT_THROW(parse_count("1.5"), InvalidArgument);
  EXPECT_THROW(parse_count("3X"), InvalidArgument);
  EXPECT_EQ(format_count(1048576), "1M");
  EXPECT_EQ(format_count(98304), "96K");
  EXPECT_EQ(format_count(1000), "1000");
}

TEST(Units, FormatsBytes) {
  EXPECT_EQ(format_bytes(256), "256 B");
  EXPECT_EQ(format_bytes(3 * 1024.0 * 1024), "3.00 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
