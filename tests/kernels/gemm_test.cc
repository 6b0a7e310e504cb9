#include "peakbound/kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include <random>
#include <vector>

#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// C = alpha * op(A) op(B) + beta * C, computed in double, row-major.
std::vector<float> naive(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& a,
                         const std::vector<float>& b, float beta, const std::vector<float>& c) {
  std::vector<float> out(c);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        double av = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        double bv = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        s += av * bv;
      }
      auto idx = static_cast<std::size_t>(i * n + j);
      out[idx] = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : beta * static_cast<double>(c[idx])));
    }
  return out;
}

std::vector<float> random_vec(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Gemm, MatchesNaiveForAllTransposesAndOddShapes) {
  std::mt19937 rng(7);
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 1, 33}, {64, 48, 5}, {31, 67, 129}};
  for (auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        int m = s[0], n = s[1], k = s[2];
        auto a = random_vec(static_cast<std::size_t>(m * k), rng);
        auto b = random_vec(static_cast<std::size_t>(k * n), rng);
        auto c = random_vec(static_cast<std::size_t>(m * n), rng);
        auto want = naive(ta, tb, m, n, k, 0.75f, a, b, 0.5f, c);
        gemm_f32(ta, tb, m, n, k, 0.75f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f, c.data(), n);
        EXPECT_LT(relative_error(c.data(), want.data(), m * n), 1e-5)
            << m << "x" << n << "x" << k << " ta=" << ta << " tb=" << tb;
      }
}

TEST(Gemm, BetaZeroIgnoresGarbageAndKZeroScales) {
  std::vector<float> a(6, 1.0f), b(6, 1.0f);
  std::vector<float> c(4, std::numeric_limits<float>::quiet_NaN());
  gemm_f32(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  for (float x : c) EXPECT_EQ(x, 3.0f);
  std::vector<float> d = {1, 2, 3, 4};
  gemm_f32(false, false, 2, 2, 0, 1.0f, a.data(), 1, b.data(), 2, 2.0f, d.data(), 2);
  EXPECT_EQ(d[3], 8.0f);
  gemm_f32(false, false, 0, 2, 3, 1.0f, nullptr, 3, b.data(), 2, 0.0f, nullptr, 2);  // empty: no-op
}

TEST(Gemm, TensorFormChecksShapes) {
  std::vector<float> a(6, 1.0f), b(8, 2.0f), c(12, 0.0f);
  Tensor ta(a.data(), Shape{3, 2}, DType::f32, Location::host);
  Tensor tb(b.data(), Shape{2, 4}, DType::f32, Location::host);
  Tensor tc(c.data(), Shape{3, 4}, DType::f32, Location::host);
  matmul(ta, false, tb, false, tc);
  EXPECT_EQ(c[11], 4.0f);
  EXPECT_THROW(matmul(ta, true, tb, false, tc), InternalError);
  EXPECT_FALSE(blas_core_name().empty());
}

// OpenBLAS's kernels for what the CPU allows (prefer_blas_kernels): the mapping, and in
// this very binary (whose main() ran it) no generic core on a CPU with AVX2 and FMA unless
// the user asked for one. On a 5th-generation Xeon (family 6 model 207) Debian's OpenBLAS
// 0.3.21 alone takes Prescott, and the second check fails without the re-execution.
TEST(Gemm, OpenBlasRunsTheKernelsTheCpuAllows) {
  CpuFeatures f;
  EXPECT_EQ(blas_core_for(f), "");
  f.avx2 = true;
  EXPECT_EQ(blas_core_for(f), "");  // no FMA: OpenBLAS's Haswell kernels need it
  f.fma = true;
  EXPECT_EQ(blas_core_for(f), "Haswell");
  f.avx512f = f.avx512bw = f.avx512vl = true;
  EXPECT_EQ(blas_core_for(f), "Haswell");  // AVX-512 without DQ: not SkylakeX's set
  f.avx512dq = true;
  EXPECT_EQ(blas_core_for(f), "SkylakeX");
  f.avx512bf16 = true;
  EXPECT_EQ(blas_core_for(f), "Cooperlake");
  EXPECT_TRUE(blas_core_is_generic("Prescott"));
  EXPECT_TRUE(blas_core_is_generic("Nehalem"));
  EXPECT_FALSE(blas_core_is_generic("Haswell"));
  EXPECT_FALSE(blas_core_is_generic("Cooperlake"));

  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const std::string allowed = blas_core_for(cpu_features());
  if (allowed.empty() || (asked != nullptr && blas_core_is_generic(asked)))
    GTEST_SKIP() << "a CPU without AVX2 and FMA, or a generic core asked for";
  EXPECT_FALSE(blas_core_is_generic(blas_core_name()))
      << "OpenBLAS runs its generic " << blas_core_name() << " kernels where " << allowed << " would run";
}

// Parking OpenBLAS's idle threads (the attention kernel's shares do, ops/attention.cc):
// threaded products before and after, parked several times in a row, give the same bits
// and the thread count stays; Debian's OpenBLAS (pthreads) has the function.
TEST(Gemm, ParkedBlasThreadsStartAgainWithTheSameBits) {
  const int before = blas_num_threads();
  set_blas_threads(2);
  const std::int64_t n = 256;  // 2^24 multiply-adds: OpenBLAS threads it
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(n * n), b(n * n), c0(n * n), c1(n * n);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  gemm_f32(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c0.data(), n);
  bool parked = false;
  for (int i = 0; i < 3; ++i) {
    parked = park_blas_threads();
    gemm_f32(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c1.data(), n);
    EXPECT_EQ(c1, c0) << "after park " << i;
    EXPECT_EQ(blas_num_threads(), 2);
  }
  if (!parked) std::printf("this OpenBLAS has no blas_thread_shutdown_: nothing parked\n");
  set_blas_threads(before);
}

TEST(Elementwise, RelativeErrorIsTheProjectMetric) {
  std::vector<float> ref = {1, -4, 2}, a = {1, -4.5f, 2};
  EXPECT_DOUBLE_EQ(relative_error(a.data(), ref.data(), 3), 0.125);
  std::vector<float> z = {0, 0}, e = {0, 1e-3f};
  EXPECT_NEAR(relative_error(e.data(), z.data(), 2), 1e-3, 1e-9);
  std::vector<float> nan = {1, std::numeric_limits<float>::quiet_NaN(), 2};
  EXPECT_TRUE(std::isnan(relative_error(nan.data(), ref.data(), 3)));
  std::vector<float> h = {1.5f, -2.25f};
  std::vector<bf16> hb(2);
  std::vector<float> back(2);
  to_bf16(hb.data(), h.data(), 2);
  to_f32(back.data(), hb.data(), 2);
  EXPECT_EQ(back, h);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
