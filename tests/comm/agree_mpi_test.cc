// agree(): a setup failure on some ranks becomes the same AgreedError on every rank (the
// lowest failing rank's message, naming that rank), so the CLI prints one line and no
// rank aborts; no failure anywhere passes through. Runs at 1-4 ranks.
#include <gtest/gtest.h>

#include <new>
#include <string>

#include "peakbound/comm/agree.h"
#include "peakbound/core/error.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::string agreed_message(const std::function<void()>& step) {
  try {
    agree(testing::world(), step);
  } catch (const AgreedError& e) {
    return e.what();
  }
  return "";
}

TEST(Agree, NoFailurePassesThrough) {
  int ran = 0;
  EXPECT_EQ(agreed_message([&] { ++ran; }), "");
  EXPECT_EQ(ran, 1);
}

TEST(Agree, OneRankFailingMakesEveryRankThrowItsMessage) {
  const int W = testing::world().size();
  const int bad = W - 1;  // the last rank alone
  const std::string m = agreed_message([&] {
    if (testing::world().rank() == bad) throw InvalidArgument("the file x.bin is truncated");
  });
  const std::string expected = (bad == 0 ? "" : "rank " + std::to_string(bad) + ": ") + "the file x.bin is truncated";
  EXPECT_EQ(m, expected);
}

TEST(Agree, TheLowestFailingRankIsReported) {
  const int W = testing::world().size();
  const std::string m = agreed_message([&] {
    const int r = testing::world().rank();
    if (r >= W / 2) throw OutOfBudget("budget of rank " + std::to_string(r));
  });
  const int first = W / 2;
  EXPECT_EQ(m, (first == 0 ? "" : "rank " + std::to_string(first) + ": ") + "budget of rank " + std::to_string(first));
}

TEST(Agree, OutOfHostMemoryIsAgreedToo) {
  const std::string m = agreed_message([&] {
    if (testing::world().rank() == 0) throw std::bad_alloc();
  });
  EXPECT_EQ(m, "out of host memory");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
