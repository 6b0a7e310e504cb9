// nn/linear.h: under f32 the helper is bitwise the ops::gemm calls it replaces (order and
// beta); under bf16 it is bitwise to_bf16 of one full-M gemm_bf16 per term into an fp32 C
// (holding the widened out in add mode), on both GEMM paths and for M on either side of
// the 256-row tile, so the row tiling changes no bits and a sum of products rounds once.
// The tile spec is 0 bytes under f32 and exactly what the bf16 form touches.
#include "peakbound/nn/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::vector<float> randn(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = peakbound::to_bf16(v[i]);
  return r;
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> r(v.size());
  std::memcpy(r.data(), v.data(), v.size() * sizeof(float));
  return r;
}

std::vector<std::uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<std::uint16_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = v[i].bits;
  return r;
}

// Restores the process's bf16 GEMM path when a test ends, pass or fail.
struct PathGuard {
  std::string before = ops::bf16_gemm_path();
  ~PathGuard() { ops::set_bf16_gemm_path(before); }
};

// OpenBLAS's thread count for a scope, restored after.
struct BlasThreads {
  int before = cpu::blas_num_threads();
  explicit BlasThreads(int n) { cpu::set_blas_threads(n); }
  ~BlasThreads() { cpu::set_blas_threads(before); }
};

constexpr std::int64_t N = 40, K1 = 400, K2 = 72;  // K1 crosses the native path's 384-deep K block

TEST(Linear, F32IsBitwiseTheGemmCallsItReplaces) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  const std::int64_t M = 300;
  const auto a1 = randn(M * K1, 1), b1 = randn(N * K1, 2), a2 = randn(M * K2, 3), b2 = randn(K2 * N, 4);
  const auto base = randn(M * N, 5);
  for (LinearMode mode : {LinearMode::write, LinearMode::add}) {
    std::vector<float> got = base, want = base;
    linear(dev, s, M, N,
           {{.a = a1.data(), .lda = K1, .b = b1.data(), .ldb = K1, .k = K1, .trans_b = true},
            {.a = a2.data(), .lda = K2, .b = b2.data(), .ldb = N, .k = K2, .trans_b = false}},
           got.data(), N, mode);
    const float beta = mode == LinearMode::add ? 1.0f : 0.0f;
    ops::gemm(dev, s, false, true, M, N, K1, 1.0f, a1.data(), K1, b1.data(), K1, beta, want.data(), N);
    ops::gemm(dev, s, false, false, M, N, K2, 1.0f, a2.data(), K2, b2.data(), N, 1.0f, want.data(), N);
    dev.synchronize(s);
    EXPECT_EQ(bits(got), bits(want)) << (mode == LinearMode::add ? "add" : "write");
  }
  // One term, written: the single gemm with beta 0 (the old contents do not leak in).
  std::vector<float> got(M * N, 7.0f), want(M * N, -3.0f);
  linear(dev, s, M, N, {{.a = a1.data(), .lda = K1, .b = b1.data(), .ldb = K1, .k = K1, .trans_b = true}}, got.data(),
         N, LinearMode::write);
  ops::gemm(dev, s, false, true, M, N, K1, 1.0f, a1.data(), K1, b1.data(), K1, 0.0f, want.data(), N);
  dev.synchronize(s);
  EXPECT_EQ(bits(got), bits(want));
}

TEST(Linear, TileSpecIsZeroUnderF32AndAtMost256RowsUnderBf16) {
  EXPECT_EQ(linear_tile_spec(600, N, Precision::f32, Component::layer).bytes, 0u);
  EXPECT_EQ(linear_tile_spec(600, N, Precision::f32, Component::layer).reserved(), 0u);
  EXPECT_EQ(linear_tile_spec(600, N, Precision::bf16, Component::layer).bytes, 256u * N * 4);
  EXPECT_EQ(linear_tile_spec(255, N, Precision::bf16, Component::layer).bytes, 255u * N * 4);
  EXPECT_EQ(linear_tile_spec(0, N, Precision::bf16, Component::layer).bytes, 0u);
  EXPECT_EQ(linear_tile_spec(3, N, Precision::bf16, Component::dispatch).component, Component::dispatch);
  EXPECT_THROW(linear_tile_spec(-1, N, Precision::bf16, Component::layer), InvalidArgument);
}

// out [M, N] with row stride ldc (ldc > N: the columns past N must stay untouched).
void check_bf16_against_full_m(Device& dev, Stream& s, std::int64_t M, std::int64_t ldc, LinearMode mode,
                               const std::string& path) {
  SCOPED_TRACE("path " + path + ", M " + std::to_string(M) + ", ldc " + std::to_string(ldc) +
               (mode == LinearMode::add ? ", add" : ", write"));
  const auto a1 = to_bf16(randn(M * K1, 11)), b1 = to_bf16(randn(N * K1, 12));
  const auto a2 = to_bf16(randn(M * K2, 13)), b2 = to_bf16(randn(K2 * N, 14));
  const auto base = to_bf16(randn(M * ldc, 15));

  // The reference: one gemm_bf16 per term over all M rows into an fp32 C, rounded once.
  std::vector<float> c(M * N, 0.0f);
  if (mode == LinearMode::add)
    for (std::int64_t r = 0; r < M; ++r)
      for (std::int64_t j = 0; j < N; ++j) c[r * N + j] = to_f32(base[r * ldc + j]);
  const float beta = mode == LinearMode::add ? 1.0f : 0.0f;
  ops::gemm_bf16(dev, s, false, true, M, N, K1, 1.0f, a1.data(), K1, b1.data(), K1, beta, c.data(), N);
  ops::gemm_bf16(dev, s, false, false, M, N, K2, 1.0f, a2.data(), K2, b2.data(), N, 1.0f, c.data(), N);
  dev.synchronize(s);
  std::vector<bf16> want = base;
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t j = 0; j < N; ++j) want[r * ldc + j] = peakbound::to_bf16(c[r * N + j]);

  // The tile exactly as the spec sizes it, then a guard the helper must not touch.
  const std::uint64_t tile_floats = linear_tile_spec(M, N, Precision::bf16, Component::layer).bytes / sizeof(float);
  const float sentinel = 1234.5f;
  std::vector<float> tile(tile_floats + 64, sentinel);
  std::fill(tile.begin(), tile.begin() + static_cast<std::ptrdiff_t>(tile_floats), -9.0f);  // stale contents
  std::vector<bf16> got = base;
  linear(dev, s, M, N,
         {{.a = a1.data(), .lda = K1, .b = b1.data(), .ldb = K1, .k = K1, .trans_b = true},
          {.a = a2.data(), .lda = K2, .b = b2.data(), .ldb = N, .k = K2, .trans_b = false}},
         got.data(), ldc, mode, tile.data());
  dev.synchronize(s);
  EXPECT_EQ(bits(got), bits(want));
  for (std::size_t i = tile_floats; i < tile.size(); ++i) ASSERT_EQ(tile[i], sentinel) << "tile overrun at " << i;
}

// The native path's row bits never depend on M or the thread count (its K order is fixed
// per element). The convert path's are OpenBLAS's sgemm's: with several threads it splits
// the rows among them, and some of its kernels sum a row's products in an order that
// depends on where the row falls in a thread's share (measured: OpenBLAS 0.3.21's Haswell
// kernels at 2 threads, M 600 against 256-row tiles, differ in the last bit; its Cooperlake
// kernels do not). So the convert path is checked on one OpenBLAS thread, where the split
// is the call's own 1024-row blocks.
TEST(Linear, Bf16IsBitwiseOneFullMGemmRoundedOnceOnBothPaths) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  PathGuard guard;
  int paths = 0;
  for (cpu::Bf16GemmPath p : {cpu::Bf16GemmPath::convert, cpu::Bf16GemmPath::native}) {
    if (!cpu::bf16_gemm_path_supported(p)) continue;
    ++paths;
    const std::string path(cpu::bf16_gemm_path_name(p));
    ops::set_bf16_gemm_path(path);
    BlasThreads threads(p == cpu::Bf16GemmPath::convert ? 1 : cpu::blas_num_threads());
    for (std::int64_t M : {1, 255, 256, 257, 600})
      for (LinearMode mode : {LinearMode::write, LinearMode::add}) check_bf16_against_full_m(dev, s, M, N, mode, path);
    check_bf16_against_full_m(dev, s, 300, N + 3, LinearMode::add, path);  // strided out: row by row conversions
  }
  EXPECT_GE(paths, 1);  // convert runs anywhere
}

TEST(Linear, ZeroRowsTouchNothing) {
  CpuDevice dev(16 << 20);
  Stream& s = dev.compute_stream();
  const auto b = to_bf16(randn(N * K2, 31));
  std::vector<bf16> out(4, peakbound::to_bf16(3.0f));
  linear(dev, s, 0, N, {{.a = nullptr, .lda = K2, .b = b.data(), .ldb = K2, .k = K2, .trans_b = true}}, out.data(), N,
         LinearMode::add, nullptr);
  for (const bf16& v : out) EXPECT_EQ(to_f32(v), 3.0f);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
