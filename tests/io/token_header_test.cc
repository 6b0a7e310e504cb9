// io/token_file.h: a file whose first KiB is shaped like an llm.c header is read by its
// header or refused by name, never as flat tokens (a wrong magic, a tokenizer file, a
// truncated header); flat nanoGPT files stay accepted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/token_file.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/pb_tokhdr_" + std::to_string(::getpid()) + "_" + name;
}

template <class T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

// llm.c's layout with any magic: 256 int32 (magic, version, count, zeros), then tokens.
void write_llmc(const std::string& path, std::int32_t magic, std::int32_t version, std::int32_t count,
                std::int64_t tokens, int width = 2, std::int32_t word3 = 0, std::int32_t rest = 0) {
  std::vector<std::int32_t> head(256, rest);
  head[0] = magic;
  head[1] = version;
  head[2] = count;
  head[3] = word3;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(head.data()), 1024);
  const std::vector<char> body(static_cast<std::size_t>(tokens * width), 1);
  f.write(body.data(), static_cast<std::streamsize>(body.size()));
}

std::string refusal(const std::string& path) {
  try {
    (void)TokenFile::open(path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFileHeader, AWrongMagicIsRefusedByName) {
  write_llmc(tmp("m.bin"), 20240521, 1, 4000, 4000);  // a typo'd magic, llm.c's shape otherwise
  const std::string why = refusal(tmp("m.bin"));
  EXPECT_NE(why.find("its magic is 20240521, not 20240520 (uint16 tokens) or 20240801 (uint32)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("version 1, 4000 tokens"), std::string::npos) << why;
  // Zeros after the count but a count that disagrees: still llm.c's shape.
  write_llmc(tmp("z.bin"), 7, 1, 99, 4000);
  EXPECT_NE(refusal(tmp("z.bin")).find("its magic is 7"), std::string::npos);
  // A count that matches the size for uint32 tokens, with words after it (no zeros).
  write_llmc(tmp("c.bin"), 123, 2, 300, 300, 4, 5, 9);
  EXPECT_NE(refusal(tmp("c.bin")).find("its magic is 123"), std::string::npos);
  // llm.c's tokenizer file (magic 20240328, version 2, vocabulary size, EOT id).
  write_llmc(tmp("tok.bin"), 20240328, 2, 50257, 3000, 2, 50256);
  EXPECT_NE(refusal(tmp("tok.bin")).find("tokenizer files have magic 20240328"), std::string::npos);
}

TEST(TokenFileHeader, AKnownMagicShorterThanTheHeaderIsRefused) {
  write_raw<std::int32_t>(tmp("short.bin"), {TokenFile::kMagicU16, 1, 10, 0, 0, 0});
  EXPECT_NE(refusal(tmp("short.bin")).find("shorter than its 1024-byte header"), std::string::npos);
}

TEST(TokenFileHeader, FlatFilesStayFlat) {
  std::mt19937 rng(5);
  std::vector<std::uint16_t> text(5000);
  for (auto& t : text) t = static_cast<std::uint16_t>(rng() % 50257);
  write_raw(tmp("flat.bin"), text);
  const TokenFile f = TokenFile::open(tmp("flat.bin"));
  EXPECT_FALSE(f.has_header());
  EXPECT_EQ(f.tokens(), 5000);
  EXPECT_EQ(f.at(0), text[0]);
  // All zeros (a padded or placeholder file): version 0 is no header.
  write_raw(tmp("zeros.bin"), std::vector<std::uint16_t>(2048, 0));
  EXPECT_EQ(TokenFile::open(tmp("zeros.bin")).tokens(), 2048);
  // Tokens 2..3 reading as version 1 but no zero run and no matching count: flat.
  text[2] = 1;
  text[3] = 0;
  write_raw(tmp("v1.bin"), text);
  EXPECT_EQ(TokenFile::open(tmp("v1.bin")).tokens(), 5000);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
