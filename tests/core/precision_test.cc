// core/precision.h: names round-trip, the aliases parse, an unknown name is a one-line
// error naming the setting and the choices, and only f32 keeps f32 activations.
#include "peakbound/core/precision.h"

#include <gtest/gtest.h>

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Precision, NamesRoundTripAndAliasesParse) {
  for (Precision p : {Precision::f32, Precision::bf16}) EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(precision_name(Precision::bf16), "bf16");
  EXPECT_EQ(parse_precision("fp32"), Precision::f32);
  EXPECT_EQ(parse_precision("float32"), Precision::f32);
  EXPECT_EQ(parse_precision("bfloat16"), Precision::bf16);
}

TEST(Precision, UnknownNameIsOneLineNamingTheSettingAndChoices) {
  try {
    parse_precision("fp16", "--precision");
    FAIL() << "fp16 parsed";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "--precision: unknown precision 'fp16' (use bf16 or f32)");
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
  EXPECT_THROW(parse_precision(""), InvalidArgument);
  EXPECT_THROW(parse_precision("BF16"), InvalidArgument);
}

TEST(Precision, DtypesFollowThePrecision) {
  EXPECT_EQ(activation_dtype(Precision::f32), DType::f32);
  EXPECT_EQ(param_dtype(Precision::f32), DType::f32);
  EXPECT_EQ(activation_dtype(Precision::bf16), DType::bf16);
  EXPECT_EQ(param_dtype(Precision::bf16), DType::bf16);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
