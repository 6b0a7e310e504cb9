// The bf16 GEMM (kernels/cpu/gemm_bf16.h), both paths, against a double reference of
// the same bf16 values: every transpose, shapes that cross each block edge (native: M
// past 96, N past 1024, K past 384 and odd; convert: M past 1024, N past 2048, K past
// 512), strides wider than the rows, written and added into.
#include "peakbound/kernels/cpu/gemm_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/gemm.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Case {
  bool ta, tb;
  std::int64_t m, n, k, pad;
  float alpha, beta;
};

std::vector<bf16> random_bf16(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<bf16> v(n);
  for (auto& x : v) x = peakbound::to_bf16(d(rng));
  return v;
}

// Checks gemm_bf16(path) on case c against the double reference, element by element:
// |got - ref| <= (k + 4) * 2^-23 * (|alpha| sum_p |a||b| + |beta c|), the fp32 bound
// for a K-term sum in any order.
void check_case(Bf16GemmPath path, const Case& c, std::mt19937& rng) {
  const std::int64_t ar = c.ta ? c.k : c.m, ac = (c.ta ? c.m : c.k) + c.pad;
  const std::int64_t br = c.tb ? c.n : c.k, bc = (c.tb ? c.k : c.n) + c.pad;
  const std::int64_t ldc = c.n + c.pad;
  const auto a = random_bf16(static_cast<std::size_t>(ar * ac), rng);
  const auto b = random_bf16(static_cast<std::size_t>(br * bc), rng);
  std::vector<float> out(static_cast<std::size_t>(c.m * ldc));
  std::normal_distribution<float> d;
  for (float& x : out) x = d(rng);
  const std::vector<float> before = out;
  gemm_bf16(path, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), ac, b.data(), bc, c.beta, out.data(), ldc);
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto idx = static_cast<std::size_t>(i * ldc + j);
      if (j >= c.n) {  // the padding of C is never written
        ASSERT_EQ(out[idx], before[idx]) << "padding written at " << i << "," << j;
        continue;
      }
      double s = 0, mag = 0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double av = to_f32(c.ta ? a[static_cast<std::size_t>(p * ac + i)] : a[static_cast<std::size_t>(i * ac + p)]);
        const double bv = to_f32(c.tb ? b[static_cast<std::size_t>(j * bc + p)] : b[static_cast<std::size_t>(p * bc + j)]);
        s += av * bv;
        mag += std::fabs(av * bv);
      }
      const double cb = c.beta == 0.0f ? 0.0 : static_cast<double>(c.beta) * before[idx];
      const double want = c.alpha * s + cb;
      const double tol = static_cast<double>(c.k + 4) * std::ldexp(1.0, -23) * (std::fabs(c.alpha) * mag + std::fabs(cb));
      ASSERT_LE(std::fabs(out[idx] - want), tol)
          << bf16_gemm_path_name(path) << " m " << c.m << " n " << c.n << " k " << c.k << " ta " << c.ta << " tb "
          << c.tb << " at " << i << "," << j << ": " << out[idx] << " vs " << want;
    }
}

std::vector<Bf16GemmPath> runnable_paths() {
  std::vector<Bf16GemmPath> paths{Bf16GemmPath::convert};
  if (bf16_gemm_path_supported(Bf16GemmPath::native)) paths.push_back(Bf16GemmPath::native);
  if (bf16_gemm_path_supported(Bf16GemmPath::amx)) paths.push_back(Bf16GemmPath::amx);
  return paths;
}

TEST(GemmBf16, MatchesADoubleReferenceOnEveryPathTransposeAndBlockEdge) {
  std::mt19937 rng(11);
  const Case cases[] = {
      {false, false, 1, 1, 1, 0, 1.0f, 0.0f},        {false, true, 3, 5, 7, 2, 0.75f, 0.5f},
      {true, false, 17, 33, 2, 1, 1.0f, 1.0f},       {true, true, 13, 31, 257, 0, -0.5f, 0.0f},
      {false, false, 97, 40, 300, 3, 1.0f, 1.0f},    {false, true, 12, 1100, 64, 0, 1.0f, 0.0f},
      {true, false, 130, 545, 513, 1, 0.25f, 0.5f},  {true, true, 200, 33, 1, 0, 2.0f, -1.0f},
      // the convert path's blocks: M past 1024, N past 2048
      {false, true, 1030, 7, 20, 0, 1.0f, 1.0f},     {true, false, 5, 2050, 3, 2, 1.0f, 0.0f},
      // several K blocks of both paths, C written (beta 0) by the first only
      {false, false, 33, 40, 1100, 0, 1.0f, 0.0f},
  };
  for (Bf16GemmPath path : runnable_paths())
    for (const Case& c : cases) check_case(path, c, rng);
  if (!bf16_gemm_path_supported(Bf16GemmPath::native))
    GTEST_SKIP() << "this CPU lacks AVX512-BF16: only the convert path was checked";
}

// The edges of every kernel: rows around the 12-row tile (1, 11, 12, 13), columns around
// the 32-column strip and its 16-lane halves (1, 31, 33), depths of one pair, an odd last
// pair and around the 384-deep K block (1, 2, 3, 383, 385), every transpose, written and
// added into; then the parallel forms (column tasks up to 512 rows of a row-major A, row
// blocks past them), one with an odd K read in place.
TEST(GemmBf16, MatchesADoubleReferenceOnEveryTileEdge) {
  std::mt19937 rng(23);
  for (Bf16GemmPath path : runnable_paths())
    for (int t = 0; t < 4; ++t)
      for (std::int64_t m : {1, 11, 12, 13})
        for (std::int64_t n : {1, 31, 33})
          for (std::int64_t k : {1, 2, 3, 383, 385})
            for (float beta : {0.0f, 1.0f})
              check_case(path, {t / 2 == 1, t % 2 == 1, m, n, k, (m + n + k) % 2, 1.0f, beta}, rng);
  const Case parallel[] = {
      {false, true, 300, 200, 101, 1, 1.0f, 1.0f},  {false, false, 520, 70, 77, 0, 1.0f, 0.0f},
      {true, false, 260, 96, 130, 2, 1.0f, 1.0f},   {true, true, 64, 300, 200, 0, 1.0f, 0.0f},
      {false, false, 100, 1030, 50, 0, 1.0f, 1.0f},
  };
  for (Bf16GemmPath path : runnable_paths())
    for (const Case& c : parallel) check_case(path, c, rng);
}

// A row of C does not depend on M, on which rows share a call, or on the thread count:
// the product over all rows, on 1 thread and on 2, is bitwise the products over row
// pieces (1, 11, 12 and the rest rows), written and added into, every transpose; on the
// native and amx paths (K past each one's K block).
TEST(GemmBf16, TiledRowsDoNotDependOnMOrThreads) {
  if (!bf16_gemm_path_supported(Bf16GemmPath::native)) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  const int threads_before = blas_num_threads();
  std::mt19937 rng(29);
  for (Bf16GemmPath path : runnable_paths()) {
    if (path == Bf16GemmPath::convert) continue;
  for (const std::int64_t m : {40, 700})
    for (int t = 0; t < 4; ++t) {
      const bool ta = t / 2 == 1, tb = t % 2 == 1;
      const std::int64_t n = 77, k = path == Bf16GemmPath::amx ? 521 : 391, lda = ta ? m : k, ldb = tb ? k : n;
      const auto a = random_bf16(static_cast<std::size_t>(m * k), rng);
      const auto b = random_bf16(static_cast<std::size_t>(n * k), rng);
      std::vector<float> base(static_cast<std::size_t>(m * n));
      std::normal_distribution<float> d;
      for (float& x : base) x = d(rng);
      for (float beta : {0.0f, 1.0f}) {
        std::vector<std::vector<float>> outs;
        for (int threads : {1, 2, 0}) {  // 0: the pieces
          std::vector<float> c = base;
          set_blas_threads(std::max(threads, 1));
          const std::vector<std::int64_t> cuts = threads == 0 ? std::vector<std::int64_t>{0, 1, 12, 24, m}
                                                              : std::vector<std::int64_t>{0, m};
          for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
            const std::int64_t r0 = cuts[i], r1 = cuts[i + 1];
            gemm_bf16(path, ta, tb, r1 - r0, n, k, 1.0f, a.data() + (ta ? r0 : r0 * lda), lda,
                      b.data(), ldb, beta, c.data() + r0 * n, n);
          }
          outs.push_back(c);
        }
        set_blas_threads(threads_before);
        for (std::size_t v = 1; v < outs.size(); ++v)
          for (std::size_t i = 0; i < outs[0].size(); ++i)
            ASSERT_EQ(std::memcmp(&outs[0][i], &outs[v][i], sizeof(float)), 0)
                << bf16_gemm_path_name(path) << " m " << m << " ta " << ta << " tb " << tb << " beta " << beta
                << " variant " << v << " at " << i << ": " << outs[0][i] << " vs " << outs[v][i];
      }
    }
  }
}

// The native path packs a transposed operand (two depths interleaved; a 12-row A strip
// four pairs at a time) into the very words it reads from a row-major one, so the product
// of A^T stored is bitwise the product of A stored, and the same for B: rows around the
// 12-row tile and the 96-row block, columns around the 32-column strip, depths around the
// four-pair step (1-9, 15-17), the odd last pair and the 384-deep K block, every
// transpose against the row-major product. A word misplaced by the packing fails it.
TEST(GemmBf16, NativeTransposedOperandsAreTheRowMajorProductBitForBit) {
  if (!bf16_gemm_path_supported(Bf16GemmPath::native)) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  std::mt19937 rng(31);
  for (const std::int64_t m : {1, 11, 12, 13, 97, 128, 600})
    for (const std::int64_t k : {1, 2, 3, 7, 8, 9, 15, 16, 17, 32, 33, 385})
      for (const std::int64_t n : {5, 45}) {
        const auto a = random_bf16(static_cast<std::size_t>(m * k), rng);  // [m, k]
        const auto b = random_bf16(static_cast<std::size_t>(k * n), rng);  // [k, n]
        std::vector<bf16> at(a.size()), bt(b.size());
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t p = 0; p < k; ++p) at[static_cast<std::size_t>(p * m + i)] = a[static_cast<std::size_t>(i * k + p)];
        for (std::int64_t p = 0; p < k; ++p)
          for (std::int64_t j = 0; j < n; ++j) bt[static_cast<std::size_t>(j * k + p)] = b[static_cast<std::size_t>(p * n + j)];
        std::vector<float> want(static_cast<std::size_t>(m * n));
        gemm_bf16(Bf16GemmPath::native, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, want.data(), n);
        for (int t = 1; t < 4; ++t) {
          const bool ta = t / 2 == 1, tb = t % 2 == 1;
          std::vector<float> got(want.size(), -1.0f);
          gemm_bf16(Bf16GemmPath::native, ta, tb, m, n, k, 1.0f, ta ? at.data() : a.data(), ta ? m : k,
                    tb ? bt.data() : b.data(), tb ? k : n, 0.0f, got.data(), n);
          for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(std::memcmp(&want[i], &got[i], sizeof(float)), 0)
                << "m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb << " at " << i << ": "
                << got[i] << " vs " << want[i];
        }
      }
}

// The amx path reads a row-major A in place (its tiles load rows lda apart) where a K
// block is whole 16-pair steps, for whole 16-row tiles, and packs the rest: a row must
// come out the same either way. A strided A (lda > K, as the flash kernel's Q and dS
// tiles) against the same product one row at a time (always packed), bit for bit, and
// the whole against the double sum.
TEST(GemmBf16, AmxReadsARowMajorAInPlaceWithTheSameBits) {
  if (!bf16_gemm_path_supported(Bf16GemmPath::amx)) GTEST_SKIP() << "this CPU has no AMX-BF16";
  std::mt19937 rng(31);
  for (const std::int64_t k : {32, 96, 544})
    for (const std::int64_t m : {16, 37, 128})
      for (const bool tb : {false, true}) {
        const std::int64_t n = 45, lda = k + 40, ldb = tb ? k : n;
        const auto a = random_bf16(static_cast<std::size_t>(m * lda), rng);
        const auto b = random_bf16(static_cast<std::size_t>(n * k), rng);
        for (const float beta : {0.0f, 1.0f}) {
          std::vector<float> whole(static_cast<std::size_t>(m * n), 0.5f), rows = whole;
          gemm_bf16(Bf16GemmPath::amx, false, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, beta, whole.data(), n);
          for (std::int64_t r = 0; r < m; ++r)
            gemm_bf16(Bf16GemmPath::amx, false, tb, 1, n, k, 0.75f, a.data() + r * lda, lda, b.data(), ldb, beta,
                      rows.data() + r * n, n);
          ASSERT_EQ(std::memcmp(whole.data(), rows.data(), whole.size() * sizeof(float)), 0)
              << "k " << k << " m " << m << " tb " << tb << " beta " << beta;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double sum = 0, mag = 0;
              for (std::int64_t p = 0; p < k; ++p) {
                const double x = to_f32(a[static_cast<std::size_t>(i * lda + p)]);
                const double y = to_f32(tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)]);
                sum += x * y;
                mag += std::abs(x * y);
              }
              const double want = 0.75 * sum + beta * 0.5;
              ASSERT_NEAR(whole[static_cast<std::size_t>(i * n + j)], want, 1e-5 * (0.75 * mag + 0.5) + 1e-6)
                  << "k " << k << " m " << m << " at " << i << "," << j;
            }
        }
      }
}

// The convert path's product with A given widened (gemm_convert_wide_a) is bitwise the
// convert path on A narrowed: every transpose, the block edges (M past 1024, N past 2048,
// K past 512), A's row stride wider than its rows, written and added into. A mutation
// (A read at another offset, or one K block's beta) fails it.
TEST(GemmBf16, ConvertWithAWidenedIsTheSameBits) {
  std::mt19937 rng(41);
  const Case cases[] = {
      {false, false, 208, 256, 4096, 3, 1.0f, 0.0f},  // Ring-DTP's dX = G W: 8 K blocks
      {true, false, 4096, 256, 208, 0, 1.0f, 1.0f},   // dW += G^T X: 4 M blocks
      {false, true, 33, 2050, 7, 1, 0.5f, 1.0f},      {true, true, 1030, 5, 513, 2, -1.0f, 0.0f},
      {false, false, 1, 1, 1, 0, 1.0f, 0.0f},         {true, false, 17, 9, 1100, 5, 2.0f, 0.5f},
  };
  for (const Case& c : cases) {
    const std::int64_t ar = c.ta ? c.k : c.m, ac = (c.ta ? c.m : c.k) + c.pad;
    const std::int64_t br = c.tb ? c.n : c.k, bc = (c.tb ? c.k : c.n) + c.pad;
    const auto a = random_bf16(static_cast<std::size_t>(ar * ac), rng);
    const auto b = random_bf16(static_cast<std::size_t>(br * bc), rng);
    std::vector<float> a_wide(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) a_wide[i] = to_f32(a[i]);
    std::vector<float> want(static_cast<std::size_t>(c.m * c.n));
    std::normal_distribution<float> d;
    for (float& x : want) x = d(rng);
    std::vector<float> got = want;
    gemm_bf16(Bf16GemmPath::convert, c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), ac, b.data(), bc, c.beta,
              want.data(), c.n);
    gemm_convert_wide_a(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a_wide.data(), ac, b.data(), bc, c.beta, got.data(), c.n);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "m " << c.m << " n " << c.n << " k " << c.k << " ta " << c.ta << " tb " << c.tb;
  }
}

TEST(GemmBf16, BetaZeroIgnoresGarbageAndKZeroScales) {
  for (Bf16GemmPath path : runnable_paths()) {
    std::vector<bf16> a(6, peakbound::to_bf16(1.0f)), b(6, peakbound::to_bf16(1.0f));
    std::vector<float> c(4, std::numeric_limits<float>::quiet_NaN());
    gemm_bf16(path, false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
    for (float x : c) EXPECT_EQ(x, 3.0f) << bf16_gemm_path_name(path);
    std::vector<float> d = {1, 2, 3, 4};
    gemm_bf16(path, false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 1, 2.0f, d.data(), 2);
    EXPECT_EQ(d, (std::vector<float>{2, 4, 6, 8})) << bf16_gemm_path_name(path);
  }
}

TEST(GemmBf16, PathsAreNamedAndAMissingOneIsAClearError) {
  EXPECT_EQ(parse_bf16_gemm_path("native"), Bf16GemmPath::native);
  EXPECT_EQ(parse_bf16_gemm_path("convert"), Bf16GemmPath::convert);
  EXPECT_EQ(parse_bf16_gemm_path("amx"), Bf16GemmPath::amx);
  EXPECT_THROW(parse_bf16_gemm_path("fast"), InvalidArgument);
  EXPECT_TRUE(bf16_gemm_path_supported(Bf16GemmPath::convert));
  // amx needs what native needs and more; the best path is the first of amx, native (on
  // AMD only: Intel's one-port VDPBF16PS loses to sgemm), convert this CPU runs.
  if (bf16_gemm_path_supported(Bf16GemmPath::amx)) {
    EXPECT_TRUE(bf16_gemm_path_supported(Bf16GemmPath::native));
  }
  const Bf16GemmPath best = bf16_gemm_path_supported(Bf16GemmPath::amx)      ? Bf16GemmPath::amx
                            : bf16_gemm_path_supported(Bf16GemmPath::native) && __builtin_cpu_is("amd")
                                ? Bf16GemmPath::native
                                : Bf16GemmPath::convert;
  EXPECT_EQ(best_bf16_gemm_path(), best);
  if (!bf16_gemm_path_supported(Bf16GemmPath::amx)) {
    std::vector<bf16> a(1, peakbound::to_bf16(1.0f));
    std::vector<float> c(1);
    try {
      gemm_bf16(Bf16GemmPath::amx, false, false, 1, 1, 1, 1.0f, a.data(), 1, a.data(), 1, 0.0f, c.data(), 1);
      ADD_FAILURE() << "amx ran on a CPU without it";
    } catch (const Unavailable& e) {
      EXPECT_NE(std::string(e.what()).find("'amx' needs AMX-BF16"), std::string::npos) << e.what();
    }
  }
  if (bf16_gemm_path_supported(Bf16GemmPath::native)) GTEST_SKIP() << "this CPU has AVX512-BF16";
  std::vector<bf16> a(1, peakbound::to_bf16(1.0f));
  std::vector<float> c(1);
  EXPECT_THROW(gemm_bf16(Bf16GemmPath::native, false, false, 1, 1, 1, 1.0f, a.data(), 1, a.data(), 1, 0.0f, c.data(), 1),
               Unavailable);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
