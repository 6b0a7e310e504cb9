// The op layer runs the CPU kernels on the CPU device's streams: inline on the compute
// stream, queued in order on a worker stream; a backend without the op says so.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Ops, GemmOnEveryStreamEqualsTheKernel) {
  CpuDevice dev(1 << 20);
  const std::int64_t M = 3, N = 5, K = 7;
  std::vector<float> a(M * K), b(K * N), want(M * N), got(M * N, 0.0f), got2(M * N, 0.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.125f * static_cast<float>(i % 5) + 0.1f;
  cpu::gemm_f32(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, want.data(), N);
  ops::gemm(dev, dev.compute_stream(), false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, got.data(), N);
  EXPECT_EQ(got, want);
  Stream& worker = dev.create_stream("ops-test");
  ops::fill(dev, worker, got2.data(), M * N, 3.0f);
  ops::gemm(dev, worker, false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, got2.data(), N);
  dev.synchronize(worker);
  EXPECT_EQ(got2, want);
}

// ops::gemm_bf16 runs the kernel on the process's path; the path is set by name, and a
// bad name or one this CPU lacks is refused without changing it.
TEST(Ops, GemmBf16RunsTheProcessPathAndRefusesABadOne) {
  CpuDevice dev(1 << 20);
  const std::int64_t M = 13, N = 33, K = 9;
  std::vector<bf16> a(M * K), b(K * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(0.25f * static_cast<float>(i % 7) - 0.5f);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(0.125f * static_cast<float>(i % 5) + 0.1f);
  const std::string before = ops::bf16_gemm_path();
  for (const char* path : {"convert", "native", "amx"}) {
    if (!cpu::bf16_gemm_path_supported(cpu::parse_bf16_gemm_path(path))) {
      EXPECT_THROW(ops::set_bf16_gemm_path(path), Unavailable);
      continue;
    }
    ops::set_bf16_gemm_path(path);
    EXPECT_EQ(ops::bf16_gemm_path(), path);
    std::vector<float> want(M * N), got(M * N);
    cpu::gemm_bf16(cpu::parse_bf16_gemm_path(path), false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f,
                   want.data(), N);
    ops::gemm_bf16(dev, dev.compute_stream(), false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, got.data(), N);
    EXPECT_EQ(got, want) << path;
    // ops::gemm on bf16 operands is this call (what code written over both types uses),
    // here adding into C (beta 1): the kernel's bits again.
    cpu::gemm_bf16(cpu::parse_bf16_gemm_path(path), true, false, M, N, K, 0.5f, a.data(), M, b.data(), N, 1.0f,
                   want.data(), N);
    ops::gemm(dev, dev.compute_stream(), true, false, M, N, K, 0.5f, a.data(), M, b.data(), N, 1.0f, got.data(), N);
    EXPECT_EQ(got, want) << path;
  }
  EXPECT_THROW(ops::set_bf16_gemm_path("fastest"), InvalidArgument);
  ops::set_bf16_gemm_path(before);
  EXPECT_EQ(ops::bf16_gemm_path(), before);
}

TEST(Ops, HostTaskRunsInStreamOrder) {
  CpuDevice dev(1 << 20);
  Stream& s = dev.create_stream("host-tasks");
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) dev.host_task(s, [&order, i] { order.push_back(i); });
  dev.synchronize(s);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
