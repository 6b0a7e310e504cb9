// The copy task: deterministic, the second copy equals the first, scored tokens are
// exactly the second copy after its first token, symbols in range.
#include "peakbound/train/copy_task.h"

#include <gtest/gtest.h>

#include <cmath>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(CopyTask, SecondHalfRepeatsTheFirstAndOnlyItIsScored) {
  for (std::int64_t S : {5, 8, 9, 128, 257}) {
    const CopyTask t{1000, S, 16, 3};
    const std::int64_t n = t.segment();
    const CopyTask::Sequence a = t.sequence(4), b = t.sequence(4), c = t.sequence(5);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_NE(a.inputs, c.inputs);
    ASSERT_EQ(static_cast<std::int64_t>(a.inputs.size()), S);
    EXPECT_EQ(a.inputs[0], CopyTask::kBos);
    EXPECT_EQ(a.inputs[static_cast<std::size_t>(1 + n)], CopyTask::kSep);
    std::int64_t scored = 0;
    for (std::int64_t i = 0; i < S; ++i) {
      const std::int32_t tg = a.targets[static_cast<std::size_t>(i)];
      if (tg == -100) continue;
      ++scored;
      // Target of input i is token i + 1, a second-copy token equal to its first copy.
      const std::int64_t pos = i + 1, k = pos - (2 + n);
      ASSERT_GE(k, 1);
      ASSERT_LT(k, n);
      EXPECT_EQ(tg, a.inputs[static_cast<std::size_t>(1 + k)]);
      EXPECT_GE(tg, CopyTask::kFirstSymbol);
      EXPECT_LT(tg, CopyTask::kFirstSymbol + 16);
    }
    EXPECT_EQ(scored, n - 1);
  }
  EXPECT_NEAR((CopyTask{1000, 64, 16, 1}.unigram_entropy()), std::log(16.0), 1e-12);
}

TEST(CopyTask, ImpossibleShapesAreRefused) {
  EXPECT_THROW((CopyTask{3, 64, 0, 1}.validate()), InvalidArgument);
  EXPECT_THROW((CopyTask{100, 4, 0, 1}.validate()), InvalidArgument);
  EXPECT_THROW((CopyTask{100, 64, 99, 1}.validate()), InvalidArgument);
  EXPECT_THROW((CopyTask{100, 64, 1, 1}.validate()), InvalidArgument);
  EXPECT_NO_THROW((CopyTask{100, 64, 98, 1}.validate()));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
