#include "peakbound/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::uint16_t bits(float f) { return to_bf16(f).bits; }

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, 1.0f, -1.0f, 2.0f, 0.5f, -3.0f, 256.0f, 1.0f / 1024})
    EXPECT_EQ(to_f32(to_bf16(f)), f) << f;
  EXPECT_EQ(bits(1.0f), 0x3f80);
  EXPECT_EQ(bits(-2.0f), 0xc000);
}

TEST(Bf16, NegativeZeroKeepsSign) {
  EXPECT_EQ(bits(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(to_f32(to_bf16(-0.0f))));
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bits(bits_float(0x3f808000u)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(bits(bits_float(0x3f818000u)), 0x3f82);
  // Just above the halfway point rounds up, just below rounds down.
  EXPECT_EQ(bits(bits_float(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bits(bits_float(0x3f807fffu)), 0x3f80);
}

TEST(Bf16, OverflowRoundsToInfinity) {
  float max = std::numeric_limits<float>::max();  // 0x7f7fffff rounds up past bf16's max
  EXPECT_EQ(bits(max), 0x7f80);
  EXPECT_EQ(bits(-max), 0xff80);
  // bf16's largest finite value survives.
  EXPECT_EQ(bits(bits_float(0x7f7f0000u)), 0x7f7f);
}

TEST(Bf16, InfinityStaysInfinity) {
  EXPECT_EQ(bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bits(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(Bf16, NanStaysNan) {
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low 16 bits must not truncate to infinity.
  float low_payload = bits_float(0x7f800001u);
  ASSERT_TRUE(std::isnan(low_payload));
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(low_payload))));
  float neg_nan = bits_float(0xff800001u);
  bf16 h = to_bf16(neg_nan);
  EXPECT_TRUE(std::isnan(to_f32(h)));
  EXPECT_EQ(h.bits & 0x8000, 0x8000);  // sign kept
}

TEST(Bf16, SubnormalsRound) {
  float tiny = bits_float(0x00010000u);  // a bf16 subnormal, exact
  EXPECT_EQ(to_f32(to_bf16(tiny)), tiny);
  float smallest = std::numeric_limits<float>::denorm_min();  // rounds to +0
  EXPECT_EQ(bits(smallest), 0x0000);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(parse_dtype("f64"), DType::f64);
  EXPECT_EQ(dtype_name(DType::f64), "f64");
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp32"), DType::f32);
  EXPECT_EQ(dtype_name(DType::i32), "i32");
  EXPECT_THROW(parse_dtype("fp8"), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
