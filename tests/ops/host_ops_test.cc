// The host ops (ops/host_adamw.h, ops/host_convert.h) compute on host memory with the
// CPU kernels: bitwise equal to the scalar references at every level this CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/adamw.h"
#include "peakbound/ops/host_adamw.h"
#include "peakbound/ops/host_convert.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(HostOps, AdamWUpdateAndSumSquaresEqualTheReference) {
  const std::int64_t n = 2 * kAdamWChunk + 77;
  std::vector<float> master(n), m(n), v(n);
  std::vector<bf16> grad(n), param(n), param_ref(n);
  for (std::int64_t i = 0; i < n; ++i) {
    master[i] = std::sin(0.001f * static_cast<float>(i));
    m[i] = 0.01f * std::cos(0.003f * static_cast<float>(i));
    v[i] = 1e-4f * static_cast<float>(i % 13);
    grad[i] = to_bf16(0.05f * std::sin(0.007f * static_cast<float>(i)) - 0.01f);
  }
  std::vector<float> master_ref = master, m_ref = m, v_ref = v;
  const AdamWStepScalars s = adamw_step_scalars(AdamWConfig{}, 3, 1e-3f, 0.75f);
  ThreadPool pool(2);
  for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
    if (!simd_level_supported(level)) continue;
    std::vector<float> mw = master, mm = m, mv = v;
    ops::host_adamw_update(pool, level, s,
                           {mw.data(), mm.data(), mv.data(), grad.data(), DType::bf16, param.data(), DType::bf16, n});
    std::vector<float> rw = master_ref, rm = m_ref, rv = v_ref;
    cpu::adamw_update_reference(s, {rw.data(), rm.data(), rv.data(), grad.data(), DType::bf16, param_ref.data(),
                                    DType::bf16, n});
    EXPECT_EQ(std::memcmp(mw.data(), rw.data(), n * sizeof(float)), 0) << simd_level_name(level);
    EXPECT_EQ(std::memcmp(mm.data(), rm.data(), n * sizeof(float)), 0) << simd_level_name(level);
    EXPECT_EQ(std::memcmp(mv.data(), rv.data(), n * sizeof(float)), 0) << simd_level_name(level);
    EXPECT_EQ(std::memcmp(param.data(), param_ref.data(), n * sizeof(bf16)), 0) << simd_level_name(level);
    const double got = ops::host_sum_squares(pool, level, grad.data(), DType::bf16, n);
    const double want = cpu::sum_squares_reference(grad.data(), DType::bf16, n);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << simd_level_name(level);
  }
}

TEST(HostOps, ConversionsAreTheScalarOnes) {
  const std::vector<float> in = {0.0f, -1.5f, 3.14159265f, 1e-20f, 65504.0f, 1.00390625f};
  std::vector<bf16> b(in.size());
  std::vector<float> back(in.size());
  ops::host_to_bf16(b.data(), in.data(), static_cast<std::int64_t>(in.size()));
  ops::host_to_f32(back.data(), b.data(), static_cast<std::int64_t>(in.size()));
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(b[i].bits, to_bf16(in[i]).bits) << i;
    EXPECT_EQ(back[i], to_f32(to_bf16(in[i]))) << i;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
