// The bf16 conversions and elementwise kernels (kernels/cpu/elementwise.h). Conversions:
// every SIMD body this CPU has, bitwise core/dtype.h's scalar to_bf16 / to_f32 over a
// structured set of bit patterns (every high half with low halves at and around the
// rounding tie, plus random words), at lengths and offsets that exercise the vector
// bodies' tails; the scalar itself against hand-worked values. fill / add / axpy in bf16:
// bitwise to_bf16 of the f32 kernel on the widened inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "peakbound/kernels/cpu/elementwise.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::bits_of;
using test_bf16::rounded_bits;
using test_bf16::widened;

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512})
    if (simd_level_supported(l)) out.push_back(l);
  return out;
}

// Every high half x low halves at the tie (0x8000), either side of it, the extremes
// and a few in between; then 2^20 random words.
std::vector<float> structured_floats() {
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x4000, 0x7ffe, 0x7fff, 0x8000,
                                0x8001, 0x8002, 0xbfff, 0xc000, 0xfffe, 0xffff};
  std::vector<float> v;
  v.reserve(65536 * std::size(lows) + (1u << 20));
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) v.push_back(bits_float(hi << 16 | lo));
  std::mt19937 rng(2028);
  for (int i = 0; i < (1 << 20); ++i) v.push_back(bits_float(static_cast<std::uint32_t>(rng())));
  return v;
}

TEST(Bf16Convert, ScalarRoundsHandWorkedCases) {
  struct Case {
    std::uint32_t in;
    std::uint16_t out;
  } cases[] = {
      {0x3f800000, 0x3f80},  // 1
      {0x3f808000, 0x3f80},  // tie, even below
      {0x3f818000, 0x3f82},  // tie, odd below: up
      {0x3f808001, 0x3f81},  // above the tie
      {0x3f807fff, 0x3f80},  // below the tie
      {0xbf818000, 0xbf82},  // the same, negative
      {0x7f7fffff, 0x7f80},  // the largest float overflows to inf
      {0x7f7f7fff, 0x7f7f},  // the largest bf16 stays
      {0x7f800000, 0x7f80},  // +inf
      {0xff800000, 0xff80},  // -inf
      {0x7f800001, 0x7fc0},  // NaN with its payload in the low half only: still NaN, quiet
      {0xff800001, 0xffc0},  // with its sign
      {0x7fc00000, 0x7fc0},  // quiet NaN
      {0x7f81ffff, 0x7fc1},  // signalling NaN: top payload bits kept, quiet bit set
      {0x00008000, 0x0000},  // smallest denormal tie: to even (zero)
      {0x00018000, 0x0002},  // denormal tie, odd below: up
      {0x00010000, 0x0001},  // a bf16 denormal is kept, not flushed
      {0x807fffff, 0x8080},  // the largest negative denormal rounds to the smallest normal
      {0x80000000, 0x8000},  // -0
  };
  for (const Case& c : cases) EXPECT_EQ(peakbound::to_bf16(bits_float(c.in)).bits, c.out) << std::hex << c.in;
}

TEST(Bf16Convert, EveryBodyIsBitwiseTheScalarOnEveryPattern) {
  const std::vector<float> in = structured_floats();
  std::vector<std::uint16_t> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = peakbound::to_bf16(in[i]).bits;
  const auto n = static_cast<std::int64_t>(in.size());
  for (SimdLevel l : levels()) {
    std::vector<bf16> out(in.size(), bf16{0x1234});
    to_bf16(l, out.data(), in.data(), n);
    EXPECT_EQ(bits_of(out), want) << simd_level_name(l);
  }
  std::vector<bf16> out(in.size());
  to_bf16(out.data(), in.data(), n);  // the widest body
  EXPECT_EQ(bits_of(out), want);
}

// round_bf16 in place holds to_f32(to_bf16(x)) for every pattern (ties, NaNs, denormals,
// overflow), on every body and at odd lengths (the scalar tail after the vectors).
TEST(Bf16Convert, RoundingInPlaceIsNarrowingThenWidening) {
  const std::vector<float> in = structured_floats();
  std::vector<std::uint32_t> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = float_bits(peakbound::to_f32(peakbound::to_bf16(in[i])));
  for (SimdLevel l : levels()) {
    std::vector<float> x = in;
    round_bf16(l, x.data(), static_cast<std::int64_t>(x.size()));
    EXPECT_EQ(bits_of(x), want) << simd_level_name(l);
    for (const std::int64_t n : {1, 7, 15, 17, 33}) {  // only the first n change
      std::vector<float> y(in.begin() + 5, in.begin() + 5 + 40);
      round_bf16(l, y.data(), n);
      for (std::int64_t i = 0; i < 40; ++i)
        ASSERT_EQ(float_bits(y[static_cast<std::size_t>(i)]),
                  i < n ? want[static_cast<std::size_t>(i + 5)] : float_bits(in[static_cast<std::size_t>(i + 5)]))
            << simd_level_name(l) << " n " << n << " at " << i;
    }
  }
}

TEST(Bf16Convert, WideningIsExactForEveryBf16) {
  std::vector<bf16> in(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) in[i].bits = static_cast<std::uint16_t>(i);
  std::vector<std::uint32_t> want(in.size());
  for (std::uint32_t i = 0; i < 65536; ++i) want[i] = i << 16;
  for (SimdLevel l : levels()) {
    std::vector<float> out(in.size(), 7.0f);
    to_f32(l, out.data(), in.data(), 65536);
    EXPECT_EQ(bits_of(out), want) << simd_level_name(l);
  }
}

// Lengths around the vector widths (8, 16) and unaligned starts: the tails go to the
// scalar body, and nothing past n is written.
TEST(Bf16Convert, TailsAndOffsetsWriteExactlyN) {
  std::mt19937 rng(5);
  std::vector<float> src(200);
  for (float& x : src) x = bits_float(static_cast<std::uint32_t>(rng()));
  for (SimdLevel l : levels()) {
    for (std::int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 129}) {
      for (int off : {0, 1, 3}) {
        std::vector<bf16> out(200, bf16{0xabcd});
        to_bf16(l, out.data() + off, src.data() + off, n);
        std::vector<float> back(200, 5.0f);
        to_f32(l, back.data() + off, out.data() + off, n);
        for (int i = 0; i < 200; ++i) {
          const bool inside = i >= off && i < off + n;
          const std::string where = std::string(simd_level_name(l)) + " n " + std::to_string(n) + " off " +
                                    std::to_string(off) + " i " + std::to_string(i);
          ASSERT_EQ(out[i].bits, inside ? peakbound::to_bf16(src[i]).bits : 0xabcd) << where;
          ASSERT_EQ(float_bits(back[i]), inside ? std::uint32_t{out[i].bits} << 16 : float_bits(5.0f)) << where;
        }
      }
    }
  }
}

// Large enough for the non-temporal stores (kConvertStreamBytes), from an unaligned
// start too (the head before the store's boundary goes to the scalar body): the same
// bits, nothing outside [off, off + n) written.
TEST(Bf16Convert, StreamingStoresGiveTheSameBits) {
  const std::int64_t n = kConvertStreamBytes / 6 + 37;
  ASSERT_TRUE(convert_streams(n));
  ASSERT_FALSE(convert_streams(n - 38));
  const auto z = static_cast<std::size_t>(n) + 8;
  std::mt19937 rng(7);
  std::vector<float> in(z);
  for (float& x : in) x = bits_float(static_cast<std::uint32_t>(rng()));
  std::vector<bf16> h(z);
  for (std::uint32_t i = 0; i < 65536; ++i) h[i].bits = static_cast<std::uint16_t>(i);
  for (std::size_t i = 65536; i < z; ++i) h[i].bits = static_cast<std::uint16_t>(rng());
  for (SimdLevel l : levels()) {
    for (int off : {0, 1, 5}) {
      std::vector<bf16> out(z, bf16{0xabcd});
      std::vector<float> back(z, 5.0f);
      to_bf16(l, out.data() + off, in.data() + off, n);
      to_f32(l, back.data() + off, h.data() + off, n);
      for (std::size_t i = 0; i < z; ++i) {
        const bool inside = i >= static_cast<std::size_t>(off) && i < static_cast<std::size_t>(off + n);
        ASSERT_EQ(out[i].bits, inside ? peakbound::to_bf16(in[i]).bits : 0xabcd)
            << simd_level_name(l) << " off " << off << " i " << i;
        ASSERT_EQ(float_bits(back[i]), inside ? std::uint32_t{h[i].bits} << 16 : float_bits(5.0f))
            << simd_level_name(l) << " off " << off << " i " << i;
      }
    }
  }
}

std::vector<bf16> random_bf16(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = peakbound::to_bf16(d(rng));
  return v;
}

TEST(Bf16Elementwise, FillAddAxpyAreTheF32KernelsRoundedOnce) {
  for (std::int64_t n : {0, 1, 15, 17, 1001}) {
    const auto z = static_cast<std::size_t>(n);
    auto a = random_bf16(z, 1, 3.0f), b = random_bf16(z, 2, 0.01f), y = random_bf16(z, 3, 1.0f);
    if (n > 4) {  // specials pass through as the f32 arithmetic makes them
      a[0] = peakbound::to_bf16(bits_float(0x7f800000));
      a[1] = bf16{0xffc1};
      a[2] = bf16{0x0003};
      b[3] = bf16{0x7f7f};
      a[3] = bf16{0x7f7f};  // overflows to inf in the add
    }
    std::vector<bf16> out(z);
    add(out.data(), a.data(), b.data(), n);
    std::vector<float> fa = widened(a), fb = widened(b), fout(z);
    add(fout.data(), fa.data(), fb.data(), n);
    EXPECT_EQ(bits_of(out), rounded_bits(fout)) << "add n " << n;

    std::vector<float> fy = widened(y);
    axpy(y.data(), a.data(), n, -0.37f);
    axpy(fy.data(), fa.data(), n, -0.37f);
    EXPECT_EQ(bits_of(y), rounded_bits(fy)) << "axpy n " << n;

    std::vector<bf16> x(z + 1, bf16{0x5555});
    fill(x.data(), n, 1.00390625f);  // halfway between two bf16 (1 + 2^-8): even wins
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i].bits, 0x3f80) << i;
    EXPECT_EQ(x[z].bits, 0x5555);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The bias kernels on odd shapes: broadcast_rows copies the bias into every row (both
// dtypes, bitwise), then add_bias adds it again (bf16: the f32 sum rounded once), and
// add_column_sums adds each column's sum into an accumulator that already holds a value.
TEST(BiasKernels, BroadcastAddAndColumnSums) {
  const std::int64_t rows = 5, cols = 7;
  std::vector<float> bias(cols), y(rows * cols, -1.0f), acc(cols, 0.5f);
  for (std::int64_t c = 0; c < cols; ++c) bias[c] = 0.25f * static_cast<float>(c) - 0.7f;
  broadcast_rows(y.data(), bias.data(), rows, cols);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[r * cols + c], bias[c]);
  add_bias(y.data(), bias.data(), rows, cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(y[i], 2.0f * bias[i % cols]);
  add_column_sums(acc.data(), y.data(), rows, cols);
  for (std::int64_t c = 0; c < cols; ++c) EXPECT_FLOAT_EQ(acc[c], 0.5f + 2.0f * rows * bias[c]);

  std::vector<bf16> b16(cols), y16(rows * cols), want(rows * cols);
  for (std::int64_t c = 0; c < cols; ++c) b16[c] = peakbound::to_bf16(bias[c] * 1.001f);
  broadcast_rows(y16.data(), b16.data(), rows, cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) want[i] = b16[i % cols];
  ASSERT_EQ(bits_of(y16), bits_of(want));
  add_bias(y16.data(), b16.data(), rows, cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) want[i] = peakbound::to_bf16(2.0f * peakbound::to_f32(b16[i % cols]));
  EXPECT_EQ(bits_of(y16), bits_of(want));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
