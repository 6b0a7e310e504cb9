// MXFP4 import (io/mxfp4.h): gpt-oss's `_blocks` / `_scales` pairs dequantized as
// transformers' convert_moe_packed_tensors does, on hand-built tensors with known values:
// every E2M1 code, the nibble order, the shared exponent (subnormal results included), the
// swap of the last two axes, an expert range, and every malformed pair a one-line error;
// and bitwise transformers' own output on random bytes (tests/fixtures/hf/mxfp4, written by
// scripts/hf_reference/make_mxfp4_fixture.py), in f32 and narrowed to bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/io/mxfp4.h"
#include "peakbound/io/safetensors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The reference, written from the format's definition (OCP MX v1.0: E2M1 = sign, two
// exponent bits with bias 1, one mantissa bit; E8M0 = 2^(s - 127)), in double.
double e2m1_reference(unsigned code) {
  const unsigned e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, static_cast<int>(e) - 1);
  return (code & 8) ? -mag : mag;
}

struct Pair {
  std::int64_t E, N, G;
  std::vector<std::uint8_t> blocks, scales;
  std::vector<std::int64_t> bshape() const { return {E, N, G, 16}; }
  std::vector<std::int64_t> sshape() const { return {E, N, G}; }
  std::uint8_t& byte(std::int64_t e, std::int64_t n, std::int64_t g, std::int64_t j) {
    return blocks[static_cast<std::size_t>(((e * N + n) * G + g) * 16 + j)];
  }
  std::uint8_t& scale(std::int64_t e, std::int64_t n, std::int64_t g) {
    return scales[static_cast<std::size_t>((e * N + n) * G + g)];
  }
  // transformers' W[e, k, n], from the definition.
  double expected(std::int64_t e, std::int64_t k, std::int64_t n) {
    const std::int64_t g = k / 32, j = (k % 32) / 2;
    const std::uint8_t b = byte(e, n, g, j);
    const unsigned code = (k % 2) ? (b >> 4) : (b & 0x0F);
    return e2m1_reference(code) * std::ldexp(1.0, static_cast<int>(scale(e, n, g)) - 127);
  }
};

Pair pattern(std::int64_t E, std::int64_t N, std::int64_t G) {
  Pair p{E, N, G, std::vector<std::uint8_t>(static_cast<std::size_t>(E * N * G * 16)),
         std::vector<std::uint8_t>(static_cast<std::size_t>(E * N * G))};
  for (std::size_t i = 0; i < p.blocks.size(); ++i) p.blocks[i] = static_cast<std::uint8_t>((i * 97 + 13) & 0xFF);
  for (std::size_t i = 0; i < p.scales.size(); ++i) p.scales[i] = static_cast<std::uint8_t>(120 + (i * 5) % 13);
  return p;
}

std::string write(const std::string& name, const Pair& p, const std::string& weight,
                  const std::string& blocks_dtype = "U8") {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / (name + ".safetensors")).string();
  write_safetensors(path, {{weight + "_blocks", blocks_dtype, p.bshape(), p.blocks.data(), p.blocks.size()},
                           {weight + "_scales", "U8", p.sshape(), p.scales.data(), p.scales.size()}});
  return path;
}

const std::string kW = "model.layers.0.mlp.experts.gate_up_proj";

TEST(Mxfp4, EveryE2m1CodeIsItsValue) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (unsigned c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_value(static_cast<std::uint8_t>(c)), want[c]) << "code " << c;
    EXPECT_EQ(e2m1_value(static_cast<std::uint8_t>(c)), e2m1_reference(c)) << "code " << c;
    EXPECT_EQ(std::signbit(e2m1_value(static_cast<std::uint8_t>(c))), c >= 8) << "code " << c;
  }
  EXPECT_EQ(e2m1_value(0xF7), 6.0f);  // only the low nibble
}

TEST(Mxfp4, AHandBuiltTensorHasItsKnownValues) {
  Pair p = pattern(2, 3, 2);  // E 2, N 3, K = 2 blocks of 32
  // Known values: byte 0x21 at scale 127 -> 0.5 (low nibble, even k) then 1.0; byte 0xF7
  // at scale 130 -> +6 * 8 then -6 * 8; code 1 at scale 0 -> 2^-128 (an f32 subnormal).
  p.byte(0, 0, 0, 0) = 0x21;
  p.scale(0, 0, 0) = 127;
  p.byte(1, 2, 1, 3) = 0xF7;
  p.scale(1, 2, 1) = 130;
  p.byte(1, 0, 1, 15) = 0x01;
  p.scale(1, 0, 1) = 0;
  const SafeTensorsFile f = SafeTensorsFile::open(write("mxfp4_known", p, kW));
  EXPECT_TRUE(has_mxfp4(f, kW));
  EXPECT_FALSE(has_mxfp4(f, "model.layers.0.mlp.experts.down_proj"));
  const Mxfp4Weight w = read_mxfp4(f, kW);
  ASSERT_EQ(w.shape, (std::vector<std::int64_t>{2, 64, 3}));
  ASSERT_EQ(w.values.size(), 2u * 64u * 3u);
  auto at = [&](std::int64_t e, std::int64_t k, std::int64_t n) {
    return w.values[static_cast<std::size_t>((e * 64 + k) * 3 + n)];
  };
  EXPECT_EQ(at(0, 0, 0), 0.5f);
  EXPECT_EQ(at(0, 1, 0), 1.0f);
  EXPECT_EQ(at(1, 32 + 6, 2), 48.0f);
  EXPECT_EQ(at(1, 32 + 7, 2), -48.0f);
  EXPECT_EQ(at(1, 32 + 30, 0), std::ldexp(1.0f, -128));
  EXPECT_EQ(at(1, 32 + 31, 0), 0.0f);
  // Every element: bitwise the definition's value (exact in f32).
  std::size_t differ = 0;
  for (std::int64_t e = 0; e < 2; ++e)
    for (std::int64_t k = 0; k < 64; ++k)
      for (std::int64_t n = 0; n < 3; ++n) differ += at(e, k, n) != static_cast<float>(p.expected(e, k, n));
  EXPECT_EQ(differ, 0u);
  // An expert range is that slice of the whole.
  const Mxfp4Weight one = read_mxfp4(f, kW, 1, 2);
  ASSERT_EQ(one.shape, (std::vector<std::int64_t>{1, 64, 3}));
  EXPECT_EQ(one.values, std::vector<float>(w.values.begin() + 64 * 3, w.values.end()));
  EXPECT_TRUE(read_mxfp4(f, kW, 1, 1).values.empty());
}

TEST(Mxfp4, TransformersDequantizationBitForBit) {
  const SafeTensorsFile f =
      SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/mxfp4/mxfp4.safetensors");
  const Mxfp4Weight w = read_mxfp4(f, "w");
  EXPECT_EQ(w.shape, f.info("w_f32").shape);
  const std::vector<float> want = f.read_f32("w_f32");
  ASSERT_EQ(w.values.size(), want.size());
  const std::span<const std::byte> want16 = f.bytes("w_bf16");
  ASSERT_EQ(want16.size(), 2 * want.size());
  std::size_t differ = 0, differ16 = 0, subnormal = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    differ += float_bits(w.values[i]) != float_bits(want[i]);
    std::uint16_t h;
    std::memcpy(&h, want16.data() + 2 * i, 2);
    differ16 += to_bf16(w.values[i]).bits != h;
    subnormal += w.values[i] != 0 && std::fpclassify(w.values[i]) == FP_SUBNORMAL;
  }
  EXPECT_EQ(differ, 0u) << "of " << want.size();
  EXPECT_EQ(differ16, 0u) << "of " << want.size();
  EXPECT_GT(subnormal, 0u) << "the fixture's scale-0 block gives subnormal values";
}

TEST(Mxfp4, TheLargestScalesAreRefusedOrExactAtTheEdgeOfTheRange) {
  Pair p = pattern(1, 1, 1);
  for (auto& b : p.blocks) b = 0x77;  // +6, +6
  p.scale(0, 0, 0) = 252;             // 6 * 2^125 = 1.5 * 2^127: finite
  EXPECT_EQ(read_mxfp4(SafeTensorsFile::open(write("mxfp4_252", p, kW)), kW).values[0], std::ldexp(6.0f, 125));
  p.scale(0, 0, 0) = 253;  // 6 * 2^126 = 1.5 * 2^128: past f32's range
  try {
    read_mxfp4(SafeTensorsFile::open(write("mxfp4_253", p, kW)), kW);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("past f32's range"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(kW), std::string::npos) << e.what();
  }
}

TEST(Mxfp4, AMalformedPairIsOneLineNamingTheTensor) {
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Pair p = pattern(2, 2, 1);
  p.scale(1, 1, 0) = 255;
  const std::string nan = error_of([&] { read_mxfp4(SafeTensorsFile::open(write("mxfp4_nan", p, kW)), kW); });
  EXPECT_NE(nan.find("scale 255"), std::string::npos) << nan;
  EXPECT_NE(nan.find("expert 1"), std::string::npos) << nan;
  p.scale(1, 1, 0) = 127;

  const std::string path = (std::filesystem::path(::testing::TempDir()) / "mxfp4_half.safetensors").string();
  write_safetensors(path, {{kW + "_blocks", "U8", p.bshape(), p.blocks.data(), p.blocks.size()}});
  const std::string half = error_of([&] { read_mxfp4(SafeTensorsFile::open(path), kW); });
  EXPECT_NE(half.find(kW + "_scales is missing"), std::string::npos) << half;

  const std::string dtype =
      error_of([&] { read_mxfp4(SafeTensorsFile::open(write("mxfp4_i8", p, kW, "I8")), kW); });
  EXPECT_NE(dtype.find("U8, not I8"), std::string::npos) << dtype;

  const std::string shape_path = (std::filesystem::path(::testing::TempDir()) / "mxfp4_shape.safetensors").string();
  write_safetensors(shape_path, {{kW + "_blocks", "U8", {2, 2, 2, 8}, p.blocks.data(), p.blocks.size()},
                                 {kW + "_scales", "U8", p.sshape(), p.scales.data(), p.scales.size()}});
  const std::string shape = error_of([&] { read_mxfp4(SafeTensorsFile::open(shape_path), kW); });
  EXPECT_NE(shape.find("[2, 2, 2, 8]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("do not match"), std::string::npos) << shape;

  const SafeTensorsFile ok = SafeTensorsFile::open(write("mxfp4_ok", p, kW));
  const std::string range = error_of([&] { read_mxfp4(ok, kW, 1, 3); });
  EXPECT_NE(range.find("experts [1, 3)"), std::string::npos) << range;
  for (const std::string& e : {nan, half, dtype, shape, range}) EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
