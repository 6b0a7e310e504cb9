// Token files in the llm.c / nanoGPT convention: header or flat, windows as llm.c's
// loader reads them, the held-out split, and bad files as one-line errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/token_file.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string tmp(const std::string& name) { return ::testing::TempDir() + "/pb_tok_" + std::to_string(::getpid()) + name; }

TEST(TokenFile, HeaderRoundTripU16AndU32) {
  std::vector<std::int32_t> small(1000), big = {1, 70000, 3};
  std::iota(small.begin(), small.end(), 0);
  write_token_file(tmp("a.bin"), small.data(), static_cast<std::int64_t>(small.size()));
  write_token_file(tmp("b.bin"), big.data(), 3);
  TokenFile a = TokenFile::open(tmp("a.bin")), b = TokenFile::open(tmp("b.bin"));
  EXPECT_TRUE(a.has_header());
  EXPECT_EQ(a.token_bytes(), 2);
  EXPECT_EQ(b.token_bytes(), 4);
  EXPECT_EQ(a.tokens(), 1000);
  EXPECT_EQ(b.at(1), 70000u);
  std::vector<std::int32_t> got(10);
  a.read(990, 10, got.data());
  EXPECT_EQ(got[9], 999);
  EXPECT_THROW(a.read(995, 10, got.data()), InvalidArgument);
}

TEST(TokenFile, WindowsAdvanceBySAsLlmcReadsThem) {
  std::vector<std::int32_t> t(23);
  std::iota(t.begin(), t.end(), 100);
  write_token_file(tmp("w.bin"), t.data(), 23);
  TokenFile f = TokenFile::open(tmp("w.bin"));
  const std::int64_t S = 5;
  EXPECT_EQ(TokenFile::windows(0, 23, S), 4);  // windows need S + 1 tokens: 0..5, 5..10, 10..15, 15..20
  std::vector<std::int32_t> in(S), tg(S);
  f.window(0, 23, S, 2, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<std::int32_t>{110, 111, 112, 113, 114}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{111, 112, 113, 114, 115}));
  EXPECT_THROW(f.window(0, 23, S, 4, in.data(), tg.data()), InvalidArgument);
  const TokenFile::Split sp = f.split(0.1, S);
  EXPECT_EQ(sp.train_end, 23 - 6);  // at least one window held out
  EXPECT_EQ(sp.eval_begin, sp.train_end);
}

TEST(TokenFile, FlatFilesAndBadFiles) {
  {
    std::ofstream f(tmp("flat.bin"), std::ios::binary);
    const std::uint16_t v[3] = {5, 6, 7};
    f.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  TokenFile flat = TokenFile::open(tmp("flat.bin"));
  EXPECT_FALSE(flat.has_header());
  EXPECT_EQ(flat.tokens(), 3);
  EXPECT_EQ(flat.at(2), 7u);
  { std::ofstream(tmp("odd.bin"), std::ios::binary) << "abc"; }
  EXPECT_THROW(TokenFile::open(tmp("odd.bin")), InvalidArgument);
  { std::ofstream(tmp("empty.bin"), std::ios::binary); }
  EXPECT_THROW(TokenFile::open(tmp("empty.bin")), InvalidArgument);
  EXPECT_THROW(TokenFile::open(tmp("missing.bin")), InvalidArgument);
  // A header claiming more tokens than the file holds.
  std::vector<std::int32_t> t = {1, 2, 3};
  write_token_file(tmp("h.bin"), t.data(), 3);
  {
    std::fstream f(tmp("h.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const std::int32_t lie = 1000;
    f.write(reinterpret_cast<const char*>(&lie), 4);
  }
  try {
    TokenFile::open(tmp("h.bin"));
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("header says 1000 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenFile::open(tmp("flat.bin"), 3), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
