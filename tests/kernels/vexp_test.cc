#include "peakbound/kernels/cpu/vexp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Units in the last place between a float and the exact (double) value.
double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::abs(static_cast<double>(got) - want) / ulp;
}

// Within 2 ulp of exp over the range the kernels use (scores shifted by their maximum,
// down to ln(FLT_MIN)), and a little above 0 (a log-sum-exp rounded below a logit).
TEST(Vexp, WithinTwoUlpOfExp) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float t = -87.3f + 88.0f * static_cast<float>(i) / 2000000.0f;
    worst = std::max(worst, ulps(exp_f32(t), std::exp(static_cast<double>(t))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
}

TEST(Vexp, EdgesGiveZeroNanAndTheClamp) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits(exp_f32(-inf)), bits(0.0f));
  EXPECT_EQ(bits(exp_f32(-100.0f)), bits(0.0f));  // below ln(FLT_MIN): flushed
  EXPECT_TRUE(std::isnan(exp_f32(std::nanf(""))));
  EXPECT_EQ(exp_f32(200.0f), exp_f32(88.0f));  // above 88: taken as 88 (finite)
  EXPECT_TRUE(std::isfinite(exp_f32(88.0f)));
  EXPECT_GT(exp_f32(-87.3f), 0.0f);
}

// The vector bodies (16 lanes where the CPU has AVX-512, two blocks of 16 at a time, then
// one, then a block of 8; 8 lanes with AVX2 alone) give exp_f32's bits in every lane, the
// sums add lane j % 8 in order then the fixed tree, and lengths that are not a multiple of
// 8 take the scalar tail (lengths below cover each mix of 32-, 16-, 8- and 1-blocks). NaN and -inf pass through as one value would.
// The bf16 form rounds each value as narrow<bf16> does and sums the unrounded ones.
TEST(Vexp, ArraysEqualTheScalarBitsAndTheLaneSum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-30.0f, 5.0f);
  for (std::int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49, 56, 63, 200}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = u(rng);
    if (n > 3) x[2] = -std::numeric_limits<float>::infinity();
    if (n > 10) x[9] = std::nanf("");
    const float shift = 1.25f;
    std::vector<float> y = x;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::int64_t j = 0; j < n; ++j) lanes[j % 8] += exp_f32(x[static_cast<std::size_t>(j)] - shift);
    const float want = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    const float got = exp_shift_sum(y.data(), n, shift);
    EXPECT_EQ(bits(got), bits(want)) << n;
    EXPECT_EQ(bits(sum_exp_shift(x.data(), n, shift)), bits(want)) << n;
    std::vector<bf16> low(static_cast<std::size_t>(n));
    const std::vector<float> x_before = x;
    EXPECT_EQ(bits(exp_shift_sum(low.data(), x.data(), n, shift)), bits(want)) << n;
    if (n > 0) {  // x unchanged (memcmp takes no null pointer, which an empty vector's data() may be)
      EXPECT_EQ(0, std::memcmp(x.data(), x_before.data(), x.size() * sizeof(float))) << n;
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const bf16 e = narrow<bf16>(exp_f32(x[static_cast<std::size_t>(j)] - shift));
      EXPECT_EQ(low[static_cast<std::size_t>(j)].bits, e.bits) << n << " " << j;
    }
    std::vector<float> z = x;
    exp_shift(z.data(), n, shift);
    for (std::int64_t j = 0; j < n; ++j) {
      const float e = exp_f32(x[static_cast<std::size_t>(j)] - shift);
      EXPECT_EQ(bits(y[static_cast<std::size_t>(j)]), bits(e)) << n << " " << j;
      EXPECT_EQ(bits(z[static_cast<std::size_t>(j)]), bits(e)) << n << " " << j;
    }
  }
}

// The rounded copy held in fp32 (the convert path's GEMM operand): each value
// widen(narrow<bf16>(exp_f32(x - shift))), beside x or over it (low == x), with the sum of
// the unrounded values; exp_shift's form keeps the unrounded ones in x too. NaN stays NaN.
TEST(Vexp, RoundedCopiesInFp32AreTheWidenedBf16Bits) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-30.0f, 5.0f);
  for (std::int64_t n : {0, 1, 7, 8, 9, 16, 17, 25, 33, 200}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = u(rng);
    if (n > 3) x[2] = -std::numeric_limits<float>::infinity();
    if (n > 10) x[9] = std::nanf("");
    const float shift = 0.75f;
    std::vector<bf16> packed(static_cast<std::size_t>(n));
    const float want = exp_shift_sum(packed.data(), x.data(), n, shift);
    std::vector<float> beside(static_cast<std::size_t>(n)), over = x, kept = x, kept_low(static_cast<std::size_t>(n));
    EXPECT_EQ(bits(exp_shift_sum(beside.data(), x.data(), n, shift)), bits(want)) << n;
    EXPECT_EQ(bits(exp_shift_sum(over.data(), over.data(), n, shift)), bits(want)) << n;
    exp_shift(kept.data(), kept_low.data(), n, shift);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto i = static_cast<std::size_t>(j);
      const float e = exp_f32(x[i] - shift), r = widen(narrow<bf16>(e));
      EXPECT_EQ(bits(widen(packed[i])), bits(r)) << n << " " << j;
      EXPECT_EQ(bits(beside[i]), bits(r)) << n << " " << j;
      EXPECT_EQ(bits(over[i]), bits(r)) << n << " " << j;
      EXPECT_EQ(bits(kept[i]), bits(e)) << n << " " << j;
      EXPECT_EQ(bits(kept_low[i]), bits(r)) << n << " " << j;
    }
  }
}

// Every lane of the vector bodies equals exp_f32 over the whole input range, in steps
// fine enough to reach every power of two the reduction makes (fx from -126 at
// ln(FLT_MIN) to 127 at the clamp) and past both clamps.
TEST(Vexp, VectorLanesEqualTheScalarBitsOverTheRange) {
  const std::int64_t n = 1 << 20;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = -90.0f + 180.0f * static_cast<float>(j) / n;
  std::vector<float> y = x;
  exp_shift(y.data(), n, 0.0f);
  std::int64_t mismatches = 0, lowest = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    const float want = exp_f32(x[static_cast<std::size_t>(j)]);
    mismatches += bits(y[static_cast<std::size_t>(j)]) != bits(want);
    lowest += want != 0.0f && want < 0x1p-125f;  // 2^fx with fx = -126
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(lowest, 0);  // the sweep reached the smallest power of two
}

// exp_shifts: a shift per element, each value exp_f32(x[j] - shift[j]) and its bf16
// rounding, whatever the length's mix of vector blocks and tail; -inf and NaN as one value.
TEST(Vexp, PerElementShiftsEqualTheScalarBits) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 5.0f);
  for (std::int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 128, 200}) {
    std::vector<float> x(static_cast<std::size_t>(n)), shift(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) {
      x[static_cast<std::size_t>(j)] = u(rng);
      shift[static_cast<std::size_t>(j)] = u(rng) + 20.0f;
    }
    if (n > 3) x[2] = -std::numeric_limits<float>::infinity();
    if (n > 10) shift[9] = std::nanf("");
    std::vector<float> y = x;
    std::vector<bf16> low(static_cast<std::size_t>(n));
    exp_shifts(y.data(), low.data(), n, shift.data());
    for (std::int64_t j = 0; j < n; ++j) {
      const auto i = static_cast<std::size_t>(j);
      const float e = exp_f32(x[i] - shift[i]);
      EXPECT_EQ(bits(y[i]), bits(e)) << n << " " << j;
      EXPECT_EQ(low[i].bits, narrow<bf16>(e).bits) << n << " " << j;
    }
  }
}

TEST(Vexp, RowMaxSkipsNans) {
  std::vector<float> x = {1.0f, std::nanf(""), 3.0f, -2.0f, 0.5f, 2.0f, 2.5f, -9.0f, 2.9f, 7.0f, -1.0f};
  EXPECT_EQ(row_max(x.data(), static_cast<std::int64_t>(x.size())), 7.0f);
  EXPECT_EQ(row_max(x.data(), 9), 3.0f);
  EXPECT_EQ(row_max(x.data(), 0), -std::numeric_limits<float>::infinity());
  // The vector bodies (16 and 8 lanes) and their tails: the scalar loop's value.
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-50.0f, 50.0f);
  for (std::int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 128, 131}) {
    std::vector<float> y(static_cast<std::size_t>(n));
    for (float& v : y) v = u(rng);
    for (std::size_t j = 0; j < y.size(); j += 5) y[j] = std::nanf("");
    float want = -std::numeric_limits<float>::infinity();
    for (float v : y) want = v > want ? v : want;
    EXPECT_EQ(bits(row_max(y.data(), n)), bits(want)) << n;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
