// AdamW kernels: the scalar reference against AdamW written out in double; every
// SIMD level and thread count bitwise equal to the reference (including tails,
// bf16 rounding ties and NaN); the sum of squares the same bits everywhere.
#include "peakbound/kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// One optimizer state plus gradients and the parameter output, any dtypes.
struct State {
  std::vector<float> master, m, v;
  std::vector<unsigned char> grad, param;
  DType gd, pd;
  std::int64_t n;

  State(std::int64_t n_, DType g, DType p, unsigned seed) : gd(g), pd(p), n(n_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> w(0.0f, 1.0f), gr(0.0f, 0.05f);
    auto un = static_cast<std::size_t>(n);
    master.resize(un);
    m.assign(un, 0.0f);
    v.assign(un, 0.0f);
    for (auto& x : master) x = w(rng);
    grad.resize(un * dtype_size(g));
    param.assign(un * dtype_size(p), 0);
    for (std::size_t i = 0; i < un; ++i) {
      float x = gr(rng);
      if (g == DType::bf16) reinterpret_cast<bf16*>(grad.data())[i] = peakbound::to_bf16(x);
      else reinterpret_cast<float*>(grad.data())[i] = x;
    }
  }
  float grad_at(std::int64_t i) const {
    auto ui = static_cast<std::size_t>(i);
    return gd == DType::bf16 ? peakbound::to_f32(reinterpret_cast<const bf16*>(grad.data())[ui])
                             : reinterpret_cast<const float*>(grad.data())[ui];
  }
  AdamWTensors tensors() {
    return {master.data(), m.data(), v.data(), grad.data(), gd, param.data(), pd, n};
  }
};

bool same_bits(const State& a, const State& b) {
  auto eq = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  return eq(a.master, b.master) && eq(a.m, b.m) && eq(a.v, b.v) && eq(a.param, b.param);
}

const AdamWConfig kConfig{2e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};

TEST(AdamW, ReferenceMatchesTheFormulaInDouble) {
  const std::int64_t n = 4099, steps = 5;
  for (DType gd : {DType::f32, DType::bf16}) {
    State s(n, gd, DType::f32, 11);
    std::vector<double> w(s.master.begin(), s.master.end()), m(static_cast<std::size_t>(n)), v(m);
    const float scale = 0.75f;
    for (std::int64_t t = 1; t <= steps; ++t) {
      const float lr = kConfig.lr * static_cast<float>(t) / steps;
      adamw_update_reference(adamw_step_scalars(kConfig, t, lr, scale), s.tensors());
      // torch.optim.AdamW, written out in double.
      const double b1 = kConfig.beta1, b2 = kConfig.beta2;
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double g = static_cast<double>(s.grad_at(static_cast<std::int64_t>(i))) * scale;
        w[i] *= 1 - static_cast<double>(lr) * kConfig.weight_decay;
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + kConfig.eps);
      }
    }
    auto rel = [&](const std::vector<float>& a, const std::vector<double>& ref) {
      std::vector<float> r(ref.begin(), ref.end());
      return relative_error(a.data(), r.data(), n);
    };
    EXPECT_LT(rel(s.master, w), 1e-5) << dtype_name(gd);
    EXPECT_LT(rel(s.m, m), 1e-5) << dtype_name(gd);
    EXPECT_LT(rel(s.v, v), 1e-5) << dtype_name(gd);
    // The parameters moved: the test would notice an update that does nothing.
    State fresh(n, gd, DType::f32, 11);
    EXPECT_GT(max_abs_diff(s.master.data(), fresh.master.data(), n), 1e-3);
    // f32 parameters are the master weights.
    EXPECT_EQ(std::memcmp(s.param.data(), s.master.data(), s.master.size() * 4), 0);
  }
}

TEST(AdamW, Bf16ParametersAreTheMasterRoundedToNearestEven) {
  State s(1000, DType::f32, DType::bf16, 3);
  // Masters that become exact ties after the step are hard to aim for; instead
  // check every element against core's to_bf16, which the dtype tests pin down.
  adamw_update_reference(adamw_step_scalars(kConfig, 1, kConfig.lr, 1.0f), s.tensors());
  const auto* p = reinterpret_cast<const bf16*>(s.param.data());
  for (std::size_t i = 0; i < s.master.size(); ++i) ASSERT_EQ(p[i].bits, peakbound::to_bf16(s.master[i]).bits) << i;
}

TEST(AdamW, EveryLevelAndThreadCountIsBitwiseTheReference) {
  const SimdLevel levels[] = {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512};
  // Tails of every width, and sizes that take the pool's multi-task path.
  const std::int64_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 33, 1000, kAdamWChunk + 5, 3 * kAdamWChunk + 13};
  int tested_levels = 0;
  for (SimdLevel level : levels) tested_levels += simd_level_supported(level) ? 1 : 0;
  // The reference's three steps once per input; each level and thread count starts from a
  // copy of the same input (generating it and stepping the reference again for each of
  // them took most of this test's time, a minute under the sanitizers).
  for (DType gd : {DType::f32, DType::bf16})
    for (DType pd : {DType::f32, DType::bf16})
      for (std::int64_t n : sizes) {
        State start(n, gd, pd, 5);
        // A NaN gradient and huge masters exercise the NaN and overflow paths of bf16 rounding.
        if (n > 3) {
          if (gd == DType::f32) reinterpret_cast<float*>(start.grad.data())[2] = std::numeric_limits<float>::quiet_NaN();
          else reinterpret_cast<bf16*>(start.grad.data())[2] = peakbound::to_bf16(std::numeric_limits<float>::quiet_NaN());
          start.master[3] = std::numeric_limits<float>::max();
        }
        State ref = start;
        for (std::int64_t t = 1; t <= 3; ++t)
          adamw_update_reference(adamw_step_scalars(kConfig, t, kConfig.lr, 0.5f), ref.tensors());
        for (SimdLevel level : levels) {
          if (!simd_level_supported(level)) continue;
          for (int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            State got = start;
            for (std::int64_t t = 1; t <= 3; ++t)
              adamw_update_parallel(pool, level, adamw_step_scalars(kConfig, t, kConfig.lr, 0.5f), got.tensors());
            ASSERT_TRUE(same_bits(ref, got)) << simd_level_name(level) << " n=" << n << " threads=" << threads
                                             << " grad " << dtype_name(gd) << " param " << dtype_name(pd);
          }
        }
      }
  EXPECT_GE(tested_levels, 1);
  if (!simd_level_supported(SimdLevel::avx512))
    std::printf("note: this CPU has no AVX-512; the avx512 body was compiled but not run here\n");
}

// Past kAdamWStreamBytes the bodies write the parameter with streaming stores from
// its first 64-byte boundary on; the bits must not change, whatever the parameter's
// alignment (the slices start 0-5 elements into the arrays) and the thread count.
TEST(AdamW, StreamedParametersAreBitwiseTheReference) {
  const std::int64_t n = kAdamWStreamBytes / 16 + 37;  // past the threshold for every dtype pair
  for (DType gd : {DType::f32, DType::bf16})
    for (DType pd : {DType::f32, DType::bf16}) {
      State ref(n, gd, pd, 11);
      ASSERT_TRUE(adamw_streams_param(ref.tensors()));
      const auto sc = adamw_step_scalars(kConfig, 1, kConfig.lr, 0.5f);
      adamw_update_reference(sc, ref.tensors());
      const State start(n, gd, pd, 11);  // copied for each run: generating it is the slow part
      int offset = 0;
      for (SimdLevel level : {SimdLevel::avx2, SimdLevel::avx512}) {
        if (!simd_level_supported(level)) continue;
        for (int threads : {1, 2}) {
          State got = start;
          ThreadPool pool(threads);
          // Elements before `offset` by the reference, the rest by the level under test.
          adamw_update_reference(sc, got.tensors().slice(0, offset));
          adamw_update_parallel(pool, level, sc, got.tensors().slice(offset, n - offset));
          ASSERT_TRUE(same_bits(ref, got)) << simd_level_name(level) << " threads=" << threads << " offset=" << offset
                                           << " grad " << dtype_name(gd) << " param " << dtype_name(pd);
          offset = (offset + 3) % 6;
        }
      }
    }
}

// f32 parameters that are the master weights (param == master, as torch.optim keeps
// them): the same master, m and v as with a separate parameter, which equals the master.
TEST(AdamW, ParameterThatIsTheMasterIsTheSameUpdate) {
  const std::int64_t small = 1000 + 13, large = kAdamWStreamBytes / 16 + 5;
  for (std::int64_t n : {small, large})
    for (DType gd : {DType::f32, DType::bf16}) {
      // The input and the reference's two steps once; each level starts from a copy.
      const State start(n, gd, DType::f32, 13);
      State ref = start;
      for (std::int64_t t = 1; t <= 2; ++t)
        adamw_update_reference(adamw_step_scalars(kConfig, t, kConfig.lr, 1.0f), ref.tensors());
      for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
        if (!simd_level_supported(level)) continue;
        State got = start;
        ThreadPool pool(2);
        AdamWTensors aliased = got.tensors();
        aliased.param = got.master.data();
        for (std::int64_t t = 1; t <= 2; ++t)
          adamw_update_parallel(pool, level, adamw_step_scalars(kConfig, t, kConfig.lr, 1.0f), aliased);
        got.param = ref.param;  // never written: compare the master with it instead
        ASSERT_TRUE(same_bits(ref, got)) << simd_level_name(level) << " n=" << n;
        ASSERT_EQ(std::memcmp(ref.param.data(), got.master.data(), got.master.size() * 4), 0) << n;
      }
    }
}

TEST(AdamW, UnsupportedLevelIsRefusedNotRun) {
  if (simd_level_supported(SimdLevel::avx512)) GTEST_SKIP() << "this CPU supports every level";
  State s(16, DType::f32, DType::f32, 1);
  EXPECT_THROW(adamw_update(SimdLevel::avx512, adamw_step_scalars(kConfig, 1, 1e-3f, 1.0f), s.tensors()),
               Unavailable);
  EXPECT_EQ(best_simd_level() == SimdLevel::avx512, false);
}

TEST(AdamW, BadArgumentsAreInvalidArgument) {
  EXPECT_THROW(adamw_step_scalars(kConfig, 0, 1e-3f, 1.0f), InvalidArgument);
  AdamWConfig c = kConfig;
  c.beta2 = 1.0f;
  EXPECT_THROW(adamw_step_scalars(c, 1, 1e-3f, 1.0f), InvalidArgument);
  c = kConfig;
  c.eps = 0.0f;
  EXPECT_THROW(adamw_step_scalars(c, 1, 1e-3f, 1.0f), InvalidArgument);
  State s(4, DType::f32, DType::i32, 1);
  EXPECT_THROW(adamw_update_reference(adamw_step_scalars(kConfig, 1, 1e-3f, 1.0f), s.tensors()), InvalidArgument);
  EXPECT_THROW(parse_simd_level("sse9"), InvalidArgument);
  EXPECT_EQ(parse_simd_level("avx2"), SimdLevel::avx2);
}

TEST(AdamW, LrScheduleWarmsUpThenDecays) {
  LrSchedule s{1.0f, 0.1f, 10, 110};
  EXPECT_FLOAT_EQ(s.lr(1), 0.1f);
  EXPECT_FLOAT_EQ(s.lr(10), 1.0f);
  EXPECT_NEAR(s.lr(60), 0.55f, 1e-6);  // half way down the cosine
  EXPECT_FLOAT_EQ(s.lr(110), 0.1f);
  EXPECT_FLOAT_EQ(s.lr(500), 0.1f);
  EXPECT_FLOAT_EQ(LrSchedule{0.5f}.lr(7), 0.5f);
  EXPECT_THROW(s.lr(0), InvalidArgument);
}

TEST(AdamW, SumOfSquaresIsTheSameBitsAtEveryLevelAndThreadCount) {
  for (DType dt : {DType::f32, DType::bf16})
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{5}, std::int64_t{17}, kSquaresBlock - 3, 3 * kSquaresBlock + 21}) {
      State s(n, dt, DType::f32, 9);
      const double ref = sum_squares_reference(s.grad.data(), dt, n);
      double exact = 0;
      for (std::int64_t i = 0; i < n; ++i) exact += static_cast<double>(s.grad_at(i)) * s.grad_at(i);
      EXPECT_NEAR(ref, exact, 1e-12 * std::max(exact, 1.0)) << n;
      for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
        if (!simd_level_supported(level)) continue;
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          const double got = sum_squares(pool, level, s.grad.data(), dt, n);
          ASSERT_EQ(std::memcmp(&got, &ref, sizeof got), 0)
              << simd_level_name(level) << " n=" << n << " threads=" << threads << ": " << got << " vs " << ref;
        }
      }
    }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
