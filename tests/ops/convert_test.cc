// The bf16 ops on the CPU device (ops/elementwise.h, swiglu.h, rmsnorm.h): each runs the
// CPU kernel of its storage type, on the compute stream and queued on a worker stream,
// and gives the kernel's bits; convert is to_bf16 / to_f32 elementwise both ways.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/rmsnorm.h"
#include "peakbound/kernels/cpu/swiglu.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/swiglu.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::bits_of;

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<bf16> random_bf16(std::size_t n, std::uint32_t seed) {
  std::vector<float> f = random_floats(n, seed);
  std::vector<bf16> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = to_bf16(f[i]);
  return b;
}

TEST(OpsBf16, ConvertBothWaysOnEveryStream) {
  CpuDevice dev(1 << 20);
  Stream& worker = dev.create_stream("convert-test");
  for (std::int64_t n : {0, 1, 23, 4099}) {
    const auto z = static_cast<std::size_t>(n);
    std::vector<float> in = random_floats(z, 1);
    if (n > 2) in[1] = bits_float(0xff800001u);  // a NaN whose payload is in the low half only
    std::vector<bf16> want(z), got(z), got2(z);
    for (std::size_t i = 0; i < z; ++i) want[i] = to_bf16(in[i]);
    ops::convert(dev, dev.compute_stream(), got.data(), in.data(), n);
    ops::convert(dev, worker, got2.data(), in.data(), n);
    dev.synchronize(worker);
    EXPECT_EQ(bits_of(got), bits_of(want)) << n;
    EXPECT_EQ(bits_of(got2), bits_of(want)) << n;
    std::vector<float> back(z), back_want(z);
    for (std::size_t i = 0; i < z; ++i) back_want[i] = to_f32(want[i]);
    ops::convert(dev, worker, back.data(), got2.data(), n);
    dev.synchronize(worker);
    EXPECT_EQ(bits_of(back), bits_of(back_want)) << n;
  }
}

TEST(OpsBf16, ElementwiseSwigluRmsnormGiveTheKernelsBits) {
  CpuDevice dev(1 << 22);
  Stream& s = dev.compute_stream();
  const std::int64_t n = 7, c = 33, nc = n * c;
  const auto z = static_cast<std::size_t>(nc);
  auto a = random_bf16(z, 2), b = random_bf16(z, 3), y = random_bf16(z, 4), dout = random_bf16(z, 5);
  auto w = random_bf16(static_cast<std::size_t>(c), 6);

  std::vector<bf16> out(z), want(z), y_op = y, y_k = y, filled(z);
  ops::add(dev, s, out.data(), a.data(), b.data(), nc);
  cpu::add(want.data(), a.data(), b.data(), nc);
  EXPECT_EQ(bits_of(out), bits_of(want));
  ops::axpy(dev, s, y_op.data(), a.data(), nc, 0.3f);
  cpu::axpy(y_k.data(), a.data(), nc, 0.3f);
  EXPECT_EQ(bits_of(y_op), bits_of(y_k));
  ops::fill(dev, s, filled.data(), nc, -2.5f);
  for (bf16 v : filled) ASSERT_EQ(v.bits, to_bf16(-2.5f).bits);

  std::vector<bf16> dg(z), du(z), dg_k(z), du_k(z);
  ops::swiglu_forward(dev, s, out.data(), a.data(), b.data(), nc);
  cpu::swiglu_forward(want.data(), a.data(), b.data(), nc);
  EXPECT_EQ(bits_of(out), bits_of(want));
  ops::swiglu_backward(dev, s, dg.data(), du.data(), dout.data(), a.data(), b.data(), nc);
  cpu::swiglu_backward(dg_k.data(), du_k.data(), dout.data(), a.data(), b.data(), nc);
  EXPECT_EQ(bits_of(dg), bits_of(dg_k));
  EXPECT_EQ(bits_of(du), bits_of(du_k));

  std::vector<float> rstd(n), rstd_k(n), dw = random_floats(static_cast<std::size_t>(c), 7), dw_k = dw;
  std::vector<bf16> dx = random_bf16(z, 8), dx_k = dx;
  ops::rmsnorm_forward(dev, s, out.data(), rstd.data(), a.data(), w.data(), n, c, 1e-5f);
  cpu::rmsnorm_forward(want.data(), rstd_k.data(), a.data(), w.data(), n, c, 1e-5f);
  EXPECT_EQ(bits_of(out), bits_of(want));
  EXPECT_EQ(bits_of(rstd), bits_of(rstd_k));
  ops::rmsnorm_backward(dev, s, dx.data(), dw.data(), dout.data(), a.data(), w.data(), rstd.data(), n, c);
  cpu::rmsnorm_backward(dx_k.data(), dw_k.data(), dout.data(), a.data(), w.data(), rstd_k.data(), n, c);
  EXPECT_EQ(bits_of(dx), bits_of(dx_k));
  EXPECT_EQ(bits_of(dw), bits_of(dw_k));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
