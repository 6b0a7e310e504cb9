// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -W(maybe-)uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warnings are off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "peakbound/kernels/cpu/bf16_lanes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Sixteen floats through to_bf16x16_native and to_bf16x16, both stored.
__attribute__((target("avx512f,avx512dq,avx512bf16"))) void both(const float* x, std::uint16_t* native,
                                                                 std::uint16_t* integer) {
  const __m512 v = _mm512_loadu_ps(x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(native), simd::to_bf16x16_native(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(integer), simd::to_bf16x16(v));
}

// VCVTNEPS2BF16 with the denormal fix-up gives to_bf16's bits for every class: normals
// (ties to even both ways), denormals (which the instruction alone reads as zero), signed
// zeros, infinities, quiet and signalling NaNs with payloads, the largest finite values
// (rounding to inf), in vectors mixing them and in vectors of normals only.
TEST(Bf16Lanes, NativeRoundingIsToBf16BitForBit) {
  if (!simd::cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  std::vector<std::uint32_t> special = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00400000u,
                                        0x00008000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u,
                                        0x7f800001u, 0xff80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f808000u,
                                        0x3f818000u, 0x3f80c000u, 0x00800000u, 0x80800000u};
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16];
    for (int l = 0; l < 16; ++l) {
      std::uint32_t u = any(rng);
      // A third of the vectors hold only normals (the fast path), the rest any class.
      if (trial % 3 == 0) u = (u & 0x807fffffu) | ((1u + u % 253u) << 23);
      else if (l % 5 == 0) u = special[(trial + l) % special.size()];
      x[l] = from_bits(u);
    }
    std::uint16_t native[16], integer[16];
    both(x, native, integer);
    for (int l = 0; l < 16; ++l) {
      ASSERT_EQ(native[l], peakbound::to_bf16(x[l]).bits) << trial << " " << l;
      ASSERT_EQ(integer[l], peakbound::to_bf16(x[l]).bits) << trial << " " << l;
    }
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
