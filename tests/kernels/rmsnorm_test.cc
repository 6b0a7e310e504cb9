#include "peakbound/kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "peakbound/kernels/cpu/elementwise.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::bits_of;
using test_bf16::rounded;
using test_bf16::rounded_bits;
using test_bf16::widened;

constexpr double kEps = 1e-5;

std::vector<float> random_vec(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The naive RMSNorm in double.
std::vector<double> naive_forward(const std::vector<double>& x, const std::vector<double>& w, int n, int c) {
  std::vector<double> out(x.size());
  for (int i = 0; i < n; ++i) {
    double ss = 0;
    for (int j = 0; j < c; ++j) ss += x[i * c + j] * x[i * c + j];
    double r = 1.0 / std::sqrt(ss / c + kEps);
    for (int j = 0; j < c; ++j) out[i * c + j] = x[i * c + j] * r * w[j];
  }
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> to_float(const std::vector<double>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

// loss = sum(dout * out): its gradient in x and w by central differences of the naive forward.
void finite_difference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dout,
                       int n, int c, std::vector<float>& dx, std::vector<float>& dw) {
  auto loss = [&](const std::vector<double>& xd, const std::vector<double>& wd) {
    auto out = naive_forward(xd, wd, n, c);
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += dout[i] * out[i];
    return s;
  };
  const double h = 1e-4;
  auto xd = to_double(x), wd = to_double(w);
  std::vector<double> gx(x.size()), gw(w.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    double keep = xd[i];
    xd[i] = keep + h;
    double up = loss(xd, wd);
    xd[i] = keep - h;
    double down = loss(xd, wd);
    xd[i] = keep;
    gx[i] = (up - down) / (2 * h);
  }
  for (std::size_t i = 0; i < w.size(); ++i) {
    double keep = wd[i];
    wd[i] = keep + h;
    double up = loss(xd, wd);
    wd[i] = keep - h;
    double down = loss(xd, wd);
    wd[i] = keep;
    gw[i] = (up - down) / (2 * h);
  }
  dx = to_float(gx);
  dw = to_float(gw);
}

TEST(RmsNorm, ForwardMatchesNaiveDouble) {
  std::mt19937 rng(11);
  for (auto [n, c] : {std::pair{1, 1}, std::pair{3, 7}, std::pair{17, 64}, std::pair{5, 1000}}) {
    auto x = random_vec(static_cast<std::size_t>(n * c), rng, -3.0f, 3.0f);
    auto w = random_vec(static_cast<std::size_t>(c), rng, 0.5f, 1.5f);
    std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, static_cast<float>(kEps));
    auto want = to_float(naive_forward(to_double(x), to_double(w), n, c));
    EXPECT_LT(relative_error(out.data(), want.data(), n * c), 1e-6) << n << "x" << c;
    // In place gives the same bits.
    std::vector<float> inplace = x;
    rmsnorm_forward(inplace.data(), nullptr, inplace.data(), w.data(), n, c, static_cast<float>(kEps));
    EXPECT_EQ(inplace, out);
  }
}

TEST(RmsNorm, ZeroRowStaysFiniteThroughEps) {
  std::vector<float> x(8, 0.0f), w(8, 1.0f), out(8, -1.0f), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, 8, 1e-5f);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(std::isfinite(rstd[0]));
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(12);
  // Not C = 1: there the output is w * sign(x), its true gradient is ~eps/|x|^3, and the
  // relative metric would measure float cancellation in a near-zero, not the kernel.
  for (auto [n, c] : {std::pair{1, 2}, std::pair{2, 3}, std::pair{6, 16}, std::pair{4, 129}}) {
    auto x = random_vec(static_cast<std::size_t>(n * c), rng, -2.0f, 2.0f);
    auto w = random_vec(static_cast<std::size_t>(c), rng, 0.5f, 1.5f);
    auto dout = random_vec(x.size(), rng, -1.0f, 1.0f);
    std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, static_cast<float>(kEps));
    std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f);
    rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), n, c);
    std::vector<float> fdx, fdw;
    finite_difference(x, w, dout, n, c, fdx, fdw);
    EXPECT_LT(relative_error(dx.data(), fdx.data(), n * c), 1e-5) << n << "x" << c;
    EXPECT_LT(relative_error(dw.data(), fdw.data(), c), 1e-5) << n << "x" << c;
  }
}

TEST(RmsNorm, BackwardAddsIntoDxAndDweight) {
  std::mt19937 rng(13);
  const int n = 4, c = 12;
  auto x = random_vec(n * c, rng, -2.0f, 2.0f);
  auto w = random_vec(c, rng, 0.5f, 1.5f);
  auto dout = random_vec(n * c, rng, -1.0f, 1.0f);
  std::vector<float> out(n * c), rstd(n);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, static_cast<float>(kEps));
  std::vector<float> dx0(n * c, 0.0f), dw0(c, 0.0f);
  rmsnorm_backward(dx0.data(), dw0.data(), dout.data(), x.data(), w.data(), rstd.data(), n, c);
  auto dx = random_vec(n * c, rng, -1.0f, 1.0f), dw = random_vec(c, rng, -1.0f, 1.0f);
  auto dx_start = dx, dw_start = dw;
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), n, c);
  for (int i = 0; i < n * c; ++i) EXPECT_FLOAT_EQ(dx[i], dx_start[i] + dx0[i]) << i;
  for (int j = 0; j < c; ++j) EXPECT_FLOAT_EQ(dw[j], dw_start[j] + dw0[j]) << j;
}

// bf16 x, weight, dout, dx; fp32 rstd and dweight, both bitwise the f32 kernel's; dx and
// dweight start non-zero (added into); zero rows, one row, odd widths.
// The kernel's operations are fixed (its vector bodies, where the CPU has them, do the
// scalar loops' operations in their order, none fused): the f32 kernel is bitwise the
// scalar formula written out here, rstd, out, dx added into and dweight, on widths around
// the 8-lane and 16-lane blocks. An FMA in the vector bodies fails it.
TEST(RmsNorm, EveryElementIsTheScalarFormulaBitForBit) {
  std::mt19937 rng(15);
  const float eps = static_cast<float>(kEps);
  const auto fb = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  for (int c : {1, 7, 8, 9, 15, 16, 17, 31, 33, 256, 1000}) {
    const int n = 3;
    const auto nc = static_cast<std::size_t>(n * c);
    const auto x = random_vec(nc, rng, -3.0f, 3.0f), w = random_vec(static_cast<std::size_t>(c), rng, 0.5f, 1.5f);
    const auto dout = random_vec(nc, rng, -1.0f, 1.0f), dx0 = random_vec(nc, rng, -1.0f, 1.0f);
    const auto dw0 = random_vec(static_cast<std::size_t>(c), rng, -1.0f, 1.0f);
    std::vector<float> out(nc), rstd(static_cast<std::size_t>(n)), dx = dx0, dw = dw0;
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, eps);
    rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), n, c);
    std::vector<float> want_dw = dw0;
    for (int i = 0; i < n; ++i) {
      const auto row = [&](int j) { return static_cast<std::size_t>(i * c + j); };
      double lanes[8] = {};
      for (int j = 0; j < c; ++j) lanes[j % 8] += static_cast<double>(x[row(j)]) * static_cast<double>(x[row(j)]);
      const double ss = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
      const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
      ASSERT_EQ(fb(rstd[static_cast<std::size_t>(i)]), fb(r)) << c;
      double dl[8] = {};
      for (int j = 0; j < c; ++j) {
        const float xr = x[row(j)] * r;
        dl[j % 8] += static_cast<double>(w[static_cast<std::size_t>(j)]) * static_cast<double>(dout[row(j)]) *
                     static_cast<double>(xr);
      }
      const double dot = ((dl[0] + dl[4]) + (dl[1] + dl[5])) + ((dl[2] + dl[6]) + (dl[3] + dl[7]));
      const float mean = static_cast<float>(dot / static_cast<double>(c));
      for (int j = 0; j < c; ++j) {
        const float wj = w[static_cast<std::size_t>(j)], g = dout[row(j)];
        const float o = x[row(j)] * r * wj;
        const float xhat = x[row(j)] * r;
        const float wg = wj * g, xm = xhat * mean;
        const float diff = wg - xm;
        const float step = r * diff;
        const float d = dx0[row(j)] + step;
        const float gx = g * xhat;
        want_dw[static_cast<std::size_t>(j)] += gx;
        ASSERT_EQ(fb(out[row(j)]), fb(o)) << c << " " << i << "," << j;
        ASSERT_EQ(fb(dx[row(j)]), fb(d)) << c << " " << i << "," << j;
      }
    }
    EXPECT_EQ(bits_of(dw), bits_of(want_dw)) << c;
  }
}

TEST(RmsNorm, Bf16IsTheF32KernelRoundedOnce) {
  std::mt19937 rng(14);
  for (auto [n, c] : {std::pair{0, 5}, std::pair{1, 1}, std::pair{3, 7}, std::pair{17, 256}, std::pair{5, 1000},
                      std::pair{2, 4099}}) {
    const auto nc = static_cast<std::size_t>(n * c), zc = static_cast<std::size_t>(c), zn = static_cast<std::size_t>(n);
    auto x = rounded(random_vec(nc, rng, -3.0f, 3.0f)), w = rounded(random_vec(zc, rng, 0.5f, 1.5f));
    auto dout = rounded(random_vec(nc, rng, -1.0f, 1.0f)), dx = rounded(random_vec(nc, rng, -1.0f, 1.0f));
    auto dw = random_vec(zc, rng, -1.0f, 1.0f);
    // The f32 kernel on the widened inputs, dx's and dweight's prior contents included.
    auto fx = widened(x), fw = widened(w), fdout = widened(dout), fdx = widened(dx);
    auto fdw = dw;
    std::vector<float> fout(nc), frstd(zn);
    rmsnorm_forward(fout.data(), frstd.data(), fx.data(), fw.data(), n, c, static_cast<float>(kEps));
    rmsnorm_backward(fdx.data(), fdw.data(), fdout.data(), fx.data(), fw.data(), frstd.data(), n, c);

    std::vector<bf16> out(nc);
    std::vector<float> rstd(zn);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, static_cast<float>(kEps));
    rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), n, c);
    EXPECT_EQ(bits_of(out), rounded_bits(fout)) << n << "x" << c;
    EXPECT_EQ(bits_of(rstd), bits_of(frstd)) << n << "x" << c;
    EXPECT_EQ(bits_of(dx), rounded_bits(fdx)) << n << "x" << c;
    EXPECT_EQ(bits_of(dw), bits_of(fdw)) << n << "x" << c;
    // In place, as the f32 form.
    auto inplace = x;
    rmsnorm_forward(inplace.data(), nullptr, inplace.data(), w.data(), n, c, static_cast<float>(kEps));
    EXPECT_EQ(bits_of(inplace), bits_of(out)) << n << "x" << c;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
