// Element types. f32 and bf16 carry model data; the integer types carry routing
// indices and counts; f64 carries reductions that must not lose precision (gradient
// norms, exactness metrics). bf16 conversion rounds to nearest even and keeps NaN a NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace peakbound {

enum class DType : std::uint8_t { f32, bf16, i32, i64, u8, f64 };

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Throws InvalidArgument for an unknown name.
DType parse_dtype(std::string_view name);

// bfloat16 storage: the top 16 bits of an IEEE-754 binary32.
struct bf16 {
  std::uint16_t bits = 0;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to even. NaN stays NaN (quiet bit set, sign kept) even when
// its payload lives only in the low 16 bits; overflow rounds to infinity as IEEE does.
inline bf16 to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

inline float to_f32(bf16 h) { return bits_float(static_cast<std::uint32_t>(h.bits) << 16); }

// Element access for kernels written once over f32 and bf16 storage (llm.c's floatX,
// chosen at run time instead of compile time). A kernel widens every element it loads
// (exact), computes in fp32 exactly as its f32 form does, and rounds once where it
// stores: so a bf16 kernel's output is bitwise narrow<bf16>(the f32 kernel's output on
// the widened inputs), which is how the tests check it. With T = float both are the
// identity and the f32 kernel keeps its bits.
inline float widen(float x) { return x; }
inline float widen(bf16 x) { return to_f32(x); }
template <typename T> T narrow(float x);
template <> inline float narrow<float>(float x) { return x; }
template <> inline bf16 narrow<bf16>(float x) { return to_bf16(x); }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

}  // namespace peakbound
