// ops::gemm on the CUDA device (cuBLAS) against the CPU device (OpenBLAS) on the same
// inputs: every transpose combination, written and added into, odd shapes, k = 0,
// and strides wider than the rows. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/device/cuda/cuda_device.h"
#include "peakbound/ops/gemm.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

struct Case {
  bool ta, tb;
  std::int64_t m, n, k, pad;
  float beta;
};

TEST(CudaGemm, MatchesTheCpuBackend) {
  PB_NEED_GPU();
  CudaDevice gpu(256 * MiB);
  CpuDevice cpu(256 * MiB);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (Case c : {Case{false, false, 1, 1, 1, 0, 0}, Case{false, true, 33, 17, 65, 0, 0}, Case{true, false, 7, 129, 3, 2, 1},
                 Case{true, true, 64, 48, 256, 5, 1}, Case{false, false, 5, 9, 0, 0, 1}, Case{false, true, 300, 257, 31, 3, 0}}) {
    const std::int64_t ar = c.ta ? c.k : c.m, ac = (c.ta ? c.m : c.k) + c.pad;
    const std::int64_t br = c.tb ? c.n : c.k, bc = (c.tb ? c.k : c.n) + c.pad;
    const std::int64_t ldc = c.n + c.pad;
    std::vector<float> a(static_cast<std::size_t>(ar * ac)), b(static_cast<std::size_t>(br * bc)),
        c0(static_cast<std::size_t>(c.m * ldc));
    for (auto* v : {&a, &b, &c0})
      for (float& x : *v) x = nd(rng);
    auto run = [&](Device& dev) {
      Buffer da = dev.allocate(Component::workspace, a.size() * 4 + 4), db = dev.allocate(Component::workspace, b.size() * 4 + 4),
             dc = dev.allocate(Component::workspace, c0.size() * 4 + 4);
      Stream& s = dev.copy_stream();
      dev.memcpy_async(da.data(), a.data(), a.size() * 4, CopyKind::host_to_device, s);
      dev.memcpy_async(db.data(), b.data(), b.size() * 4, CopyKind::host_to_device, s);
      dev.memcpy_async(dc.data(), c0.data(), c0.size() * 4, CopyKind::host_to_device, s);
      dev.wait(dev.compute_stream(), dev.record(s));
      ops::gemm(dev, dev.compute_stream(), c.ta, c.tb, c.m, c.n, c.k, 0.75f, static_cast<float*>(da.data()), ac,
                static_cast<float*>(db.data()), bc, c.beta, static_cast<float*>(dc.data()), ldc);
      dev.wait(s, dev.record(dev.compute_stream()));
      std::vector<float> out(c0.size());
      dev.memcpy_async(out.data(), dc.data(), out.size() * 4, CopyKind::device_to_host, s);
      dev.synchronize(s);
      return out;
    };
    const std::vector<float> want = run(cpu), got = run(gpu);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i])) * static_cast<float>(1 + c.k))
          << "m " << c.m << " n " << c.n << " k " << c.k << " element " << i;
  }
}

}  // namespace
}  // namespace peakbound
