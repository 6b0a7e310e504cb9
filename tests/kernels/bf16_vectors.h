// Host vectors between f32 and bf16 for the tests of the bf16 kernel forms: round each
// element to bf16 (nearest even), widen back (exact), and the raw bits to compare a bf16
// form bitwise with to_bf16 of the f32 form (docs/design.md, "Mixed precision").
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/dtype.h"

namespace peakbound::test_bf16 {

inline std::vector<bf16> rounded(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = ::peakbound::to_bf16(v[i]);
  return out;
}

inline std::vector<float> widened(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = widen(v[i]);
  return out;
}

inline std::vector<std::uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
  return out;
}

inline std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = float_bits(v[i]);
  return out;
}

// The bits of each element rounded to bf16: what a bf16 form's output must equal.
inline std::vector<std::uint16_t> rounded_bits(const std::vector<float>& v) { return bits_of(rounded(v)); }

}  // namespace peakbound::test_bf16
