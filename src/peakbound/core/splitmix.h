// splitmix64 (Steele, Lea and Flood; Vigna's reference constants): a counter-based
// generator, so value i of a stream needs no state. mix64 is its finalizer (a bijection
// of 64 bits that spreads every input bit over the output); splitmix64(x) is the
// generator's output for state x: mix64 of x plus the golden-ratio increment. The model's
// initialisation, the random-ids task and the benchmarks' synthetic inputs draw from it.
#pragma once

#include <cstdint>

namespace peakbound {

inline constexpr std::uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;

constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr std::uint64_t splitmix64(std::uint64_t x) { return mix64(x + kSplitmixGamma); }

}  // namespace peakbound
