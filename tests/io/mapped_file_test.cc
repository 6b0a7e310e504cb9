// io/mapped_file.h: a mapped input truncated while it is read ends the process with one
// line naming the file (its SIGBUS handler), not a bare "Bus error".
#include "peakbound/io/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "peakbound/io/token_file.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/pb_map_" + std::to_string(::getpid()) + "_" + name;
}

TEST(MappedFileDeathTest, ATokenFileTruncatedWhileReadIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = tmp("tokens.bin");
  std::vector<std::int32_t> t(20000);
  std::iota(t.begin(), t.end(), 0);
  write_token_file(path, t.data(), static_cast<std::int64_t>(t.size()));
  EXPECT_EXIT(
      {
        const TokenFile f = TokenFile::open(path);
        if (::truncate(path.c_str(), 0) != 0) std::exit(2);
        std::uint64_t sum = 0;
        for (std::int64_t i = 0; i < f.tokens(); i += 512) sum += f.at(i);  // faults past the new end
        std::exit(sum == 0 ? 3 : 4);
      },
      ::testing::ExitedWithCode(1),
      "^peakbound: error: .*pb_map_[0-9]+_tokens\\.bin was truncated or changed while it was read \\(");
  std::remove(path.c_str());
}

TEST(MappedFileDeathTest, ABusErrorOutsideTheMappingsIsLeftAlone) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's own SIGBUS handler is the previous disposition here";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = tmp("other.bin");
  std::vector<std::int32_t> t(20000, 7);
  write_token_file(path, t.data(), static_cast<std::int64_t>(t.size()));
  EXPECT_EXIT(
      {
        const MappedFile f = MappedFile::open(path);  // a live mapping, the handler installed
        if (f.size() == 0) std::exit(2);
        raise(SIGBUS);  // not a fault in any mapping: the default disposition, as before
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
  std::remove(path.c_str());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
