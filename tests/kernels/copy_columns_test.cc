// copy_columns (kernels/cpu/elementwise.h): column blocks between strided rows, in order,
// deinterleaved (DeepSeek's rope pairs to rotate_half's halves) or interleaved back, written
// or accumulated, f32 and bf16 (one rounding at the store); deinterleave then interleave is
// the identity; bad shapes are one-line errors.
#include <gtest/gtest.h>

#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using cpu::ColumnOrder;

TEST(CopyColumns, BlocksReorderAndAccumulate) {
  // src: 2 rows of 6 (stride 7), columns 1..4 taken.
  std::vector<float> src = {0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16};
  std::vector<float> dst(2 * 5, -1.0f);
  cpu::copy_columns(dst.data(), 5, src.data() + 1, 7, 2, 4, ColumnOrder::same, false);
  EXPECT_EQ(dst, (std::vector<float>{1, 2, 3, 4, -1, 11, 12, 13, 14, -1}));
  cpu::copy_columns(dst.data(), 5, src.data() + 1, 7, 2, 4, ColumnOrder::deinterleave, false);
  EXPECT_EQ(dst, (std::vector<float>{1, 3, 2, 4, -1, 11, 13, 12, 14, -1}));  // evens, then odds
  std::vector<float> back(2 * 4, 0.0f);
  cpu::copy_columns(back.data(), 4, dst.data(), 5, 2, 4, ColumnOrder::interleave, false);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 3, 4, 11, 12, 13, 14}));
  cpu::copy_columns(back.data(), 4, dst.data(), 5, 2, 4, ColumnOrder::interleave, true);
  EXPECT_EQ(back, (std::vector<float>{2, 4, 6, 8, 22, 24, 26, 28}));
}

TEST(CopyColumns, Bf16RoundsOnceAtTheStore) {
  const std::vector<float> src = {1.0f, 1.0f / 3.0f};
  std::vector<bf16> dst = {to_bf16(0.5f), to_bf16(0.0f)};
  cpu::copy_columns(dst.data(), 2, src.data(), 2, 1, 2, ColumnOrder::same, true);
  EXPECT_EQ(to_f32(dst[0]), to_f32(to_bf16(1.5f)));
  EXPECT_EQ(to_f32(dst[1]), to_f32(to_bf16(1.0f / 3.0f)));
  std::vector<float> acc = {0.25f, 0.0f};
  cpu::copy_columns(acc.data(), 2, dst.data(), 2, 1, 2, ColumnOrder::same, true);
  EXPECT_EQ(acc[0], 0.25f + to_f32(dst[0]));
}

TEST(CopyColumns, BadShapesAreOneLineErrors) {
  std::vector<float> a(8), b(8);
  EXPECT_THROW(cpu::copy_columns(a.data(), 3, b.data(), 4, 1, 3, ColumnOrder::deinterleave, false), InvalidArgument);
  EXPECT_THROW(cpu::copy_columns(a.data(), 2, b.data(), 4, 1, 3, ColumnOrder::same, false), InvalidArgument);
  EXPECT_THROW(cpu::copy_columns(a.data(), 4, b.data(), 4, -1, 3, ColumnOrder::same, false), InvalidArgument);
  EXPECT_THROW(cpu::copy_columns(a.data(), 4, b.data(), 2, 1, 3, ColumnOrder::same, false), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
