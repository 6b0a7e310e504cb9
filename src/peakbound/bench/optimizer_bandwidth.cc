#include "peakbound/bench/optimizer_bandwidth.h"

#include <vector>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>

#include "peakbound/bench/harness.h"
#include "peakbound/core/error.h"
#include "peakbound/ops/adamw_types.h"

namespace peakbound {

namespace {

// Copies n floats (a multiple of 16, 16-byte aligned) with streaming stores: the
// destination is not read for ownership, so the copy moves only the bytes it counts.
// SSE2 is in every x86-64 CPU, so no target attribute is needed.
void stream_copy(float* dst, const float* src, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; i += 16) {
    const __m128 a = _mm_load_ps(src + i), b = _mm_load_ps(src + i + 4), c = _mm_load_ps(src + i + 8),
                 d = _mm_load_ps(src + i + 12);
    _mm_stream_ps(dst + i, a);
    _mm_stream_ps(dst + i + 4, b);
    _mm_stream_ps(dst + i + 8, c);
    _mm_stream_ps(dst + i + 12, d);
  }
  _mm_sfence();
}

// The AdamW update's memory traffic with trivial arithmetic, 8 elements a step with
// AVX2. As the large update (kernels/cpu/adamw.h, kAdamWStreamBytes), the write-only
// bf16 output goes out with non-temporal stores where p + lo is 16-byte aligned, so
// the kernel moves the 28 bytes it counts, not 2 more for a read for ownership.
template <bool kStream>
__attribute__((target("avx2"))) void adam_pattern_avx2(float* w, float* m, float* v, const std::uint16_t* g,
                                                       std::uint16_t* p, std::uint64_t lo, std::uint64_t hi) {
  const __m256 half = _mm256_set1_ps(0.5f);
  for (std::uint64_t i = lo; i < hi; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + i));
    const __m256 gi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), half), gi);
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), half), gi);
    const __m256 wi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), half), mi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(w + i, wi);
    const __m256i hi16 = _mm256_srli_epi32(_mm256_castps_si256(wi), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(hi16), _mm256_extracti128_si256(hi16, 1));
    if constexpr (kStream) _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), packed);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), packed);
  }
  if constexpr (kStream) _mm_sfence();
}

// The same in plain C++ (the compiler's SSE2), for CPUs without AVX2.
void adam_pattern(float* w, float* m, float* v, const std::uint16_t* g, std::uint16_t* p, std::uint64_t lo,
                  std::uint64_t hi) {
  for (std::uint64_t i = lo; i < hi; ++i) {
    std::uint32_t bits = static_cast<std::uint32_t>(g[i]) << 16;
    float gi;
    std::memcpy(&gi, &bits, 4);
    m[i] = m[i] * 0.5f + gi;
    v[i] = v[i] * 0.5f + gi;
    w[i] = w[i] * 0.5f + m[i];
    std::uint32_t out;
    std::memcpy(&out, &w[i], 4);
    p[i] = static_cast<std::uint16_t>(out >> 16);
  }
}

}  // namespace

MemoryBandwidth::MemoryBandwidth(ThreadPool& pool, std::uint64_t working_set_bytes) : pool_(pool) {
  if (working_set_bytes < (1u << 20)) throw InvalidArgument("optimizer bench bandwidth_bytes must be at least 1MiB");
  // Whole chunks (see run_once), so every task's length is a multiple of 64 elements.
  n_ = std::max<std::uint64_t>(working_set_bytes / 16 / kAdamWChunk, 1) * kAdamWChunk;
  const std::vector<std::uint64_t> sizes = {4 * n_, 4 * n_, 4 * n_, 2 * n_, 2 * n_};
  block_ = StaggeredBlock(host_, BufferSpec{Component::workspace, staggered_layout(sizes).bytes}, sizes);
  float* a = block_.as<float>(0);
  float* b = block_.as<float>(1);
  float* c = block_.as<float>(2);
  auto* d = block_.as<std::uint16_t>(3);
  auto* e = block_.as<std::uint16_t>(4);
  pool_.parallel_for(pool_.size(), [&](std::int64_t t) {
    const std::uint64_t lo = n_ * static_cast<std::uint64_t>(t) / static_cast<std::uint64_t>(pool_.size());
    const std::uint64_t hi = n_ * static_cast<std::uint64_t>(t + 1) / static_cast<std::uint64_t>(pool_.size());
    for (std::uint64_t i = lo; i < hi; ++i) {
      a[i] = 1.0f;
      b[i] = 0.5f;
      c[i] = 0.25f;
      d[i] = 0x3f80;  // bf16 1.0
      e[i] = 0;
    }
  });
}

void MemoryBandwidth::run_once() {
  float* a = block_.as<float>(0);
  float* b = block_.as<float>(1);
  float* c = block_.as<float>(2);
  auto* d = block_.as<std::uint16_t>(3);
  auto* e = block_.as<std::uint16_t>(4);
  const double n = static_cast<double>(n_);
  // Tasks as the AdamW update hands them out (kAdamWChunk elements, taken in turn):
  // the threads then stream neighbouring addresses, which this memory system serves
  // faster than two far-apart halves; a kernel split any worse would understate
  // the bandwidth.
  const auto chunk = static_cast<std::uint64_t>(kAdamWChunk);
  auto timed = [&](auto&& body) {
    bench::Stopwatch w;
    pool_.parallel_for(static_cast<std::int64_t>((n_ + chunk - 1) / chunk), [&](std::int64_t t) {
      const std::uint64_t lo = static_cast<std::uint64_t>(t) * chunk;
      body(lo, std::min(n_, lo + chunk));
    });
    return w.seconds();
  };
  memcpy_ = std::max(memcpy_, 8 * n / timed([&](auto lo, auto hi) { std::memcpy(b + lo, a + lo, (hi - lo) * 4); }) / 1e9);
  stream_ = std::max(stream_, 8 * n / timed([&](auto lo, auto hi) { stream_copy(b + lo, a + lo, hi - lo); }) / 1e9);
  rmw_ = std::max(rmw_, 12 * n / timed([&](auto lo, auto hi) {
    for (std::uint64_t i = lo; i < hi; ++i) c[i] = c[i] * 0.5f + a[i];
  }) / 1e9);
  const bool avx2 = __builtin_cpu_supports("avx2");
  adam_ = std::max(adam_, 28 * n / timed([&](auto lo, auto hi) {
    if (avx2 && reinterpret_cast<std::uintptr_t>(e + lo) % 16 == 0) adam_pattern_avx2<true>(a, b, c, d, e, lo, hi);
    else if (avx2) adam_pattern_avx2<false>(a, b, c, d, e, lo, hi);
    else adam_pattern(a, b, c, d, e, lo, hi);
  }) / 1e9);
}

double MemoryBandwidth::best_gbps() const { return std::max({memcpy_, stream_, rmw_, adam_}); }

nlohmann::json MemoryBandwidth::to_json() const {
  return {{"memcpy_gbps", memcpy_},
          {"stream_copy_gbps", stream_},
          {"read_modify_write_gbps", rmw_},
          {"adam_pattern_gbps", adam_},
          {"working_set_bytes", block_.bytes()}};
}

}  // namespace peakbound
