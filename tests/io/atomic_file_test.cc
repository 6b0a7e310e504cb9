// io/atomic_file.h: CRC-32 against its check value and a bitwise reference at every
// length and split, the atomic write (content, mode, the sum of what was written, no
// temporary left behind) and its errors.
#include "peakbound/io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::uint32_t crc_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

TEST(Crc32, CheckValueAndEveryLengthAndSplit) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the CRC-32 (IEEE) check value
  EXPECT_EQ(crc32("", 0), 0u);
  std::mt19937 rng(3);
  std::vector<unsigned char> b(300);
  for (auto& x : b) x = static_cast<unsigned char>(rng());
  for (std::size_t n = 0; n <= b.size(); n += 7) {
    const std::uint32_t want = crc_bitwise(b.data(), n);
    ASSERT_EQ(crc32(b.data(), n), want) << n;
    for (std::size_t cut : {std::size_t{0}, n / 3, n}) ASSERT_EQ(crc32(b.data() + cut, n - cut, crc32(b.data(), cut)), want);
  }
}

TEST(AtomicFile, WritesTheContentItsSumAndNoTemporary) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "pb_atomic_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "f.bin").string();
  const std::string a = "hello, ", b = "world";
  const std::span<const std::byte> parts[2] = {{reinterpret_cast<const std::byte*>(a.data()), a.size()},
                                               {reinterpret_cast<const std::byte*>(b.data()), b.size()}};
  FileSum sum;
  write_file_atomic(path, parts, &sum);
  std::ifstream in(path);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, "hello, world");
  const FileSum read = file_sum(path);
  EXPECT_EQ(sum.bytes, 12u);
  EXPECT_EQ(sum.bytes, read.bytes);
  EXPECT_EQ(sum.crc, read.crc);
  EXPECT_EQ(sum.crc, crc32("hello, world", 12));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);  // not mkstemp's 0600
  write_text_atomic(path, "replaced");
  EXPECT_EQ(file_sum(path).bytes, 8u);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() != "f.bin" ? 1 : 0;
  EXPECT_EQ(entries, 0) << "a temporary file was left behind";
  // A folder that is a file: one error naming the path.
  EXPECT_THROW(write_text_atomic(path + "/x", "y"), Error);
  EXPECT_THROW(file_sum((dir / "missing").string()), Error);
  fs::remove_all(dir);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
