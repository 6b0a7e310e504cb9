// RoPE against a naive double-precision transcription of transformers'
// apply_rotary_pos_emb (cos/sin of the angles duplicated to [T, D], rotate_half);
// the backward against forward-then-backward = identity and finite differences of
// the double reference; odd shapes; odd head dims refused. The bf16 forms (bf16 q / k,
// fp32 tables) bitwise against the f32 forms on the widened input, rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/rope.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::rounded;
using test_bf16::widened;

// transformers, literally: inv_freq = 1 / theta^(arange(0, D, 2) / D); freqs =
// positions x inv_freq; emb = cat(freqs, freqs); out = x*cos(emb) + rotate_half(x)*sin(emb).
std::vector<double> reference(const std::vector<double>& x, std::int64_t T, std::int64_t heads,
                              std::int64_t D, std::int64_t offset, double theta) {
  std::vector<double> out(x.size());
  const std::int64_t half = D / 2;
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<double> emb(D);
    for (std::int64_t i = 0; i < half; ++i)
      emb[i] = emb[i + half] = static_cast<double>(offset + t) / std::pow(theta, static_cast<double>(2 * i) / D);
    for (std::int64_t h = 0; h < heads; ++h) {
      const double* v = x.data() + (t * heads + h) * D;
      double* o = out.data() + (t * heads + h) * D;
      for (std::int64_t j = 0; j < D; ++j) {
        const double rot = j < half ? -v[j + half] : v[j - half];  // rotate_half
        o[j] = v[j] * std::cos(emb[j]) + rot * std::sin(emb[j]);
      }
    }
  }
  return out;
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return diff / ref;
}

std::vector<float> values(std::int64_t n, int seed) {
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i + 1) * seed) * 1.5);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Shape {
  std::int64_t T, Hq, Hkv, D, offset;
  double theta;
};

void PrintTo(const Shape& p, std::ostream* os) {
  *os << "T=" << p.T << " Hq=" << p.Hq << " Hkv=" << p.Hkv << " D=" << p.D << " offset=" << p.offset
      << " theta=" << p.theta;
}

class Rope : public ::testing::TestWithParam<Shape> {};

TEST_P(Rope, ForwardMatchesTransformersInDouble) {
  const Shape p = GetParam();
  CpuDevice dev(1 << 20);
  std::vector<float> cos(ops::rope_table_elems(p.T, p.D)), sin(cos.size());
  ops::rope_tables(dev, dev.compute_stream(), cos.data(), sin.data(), p.T, p.D, p.offset, p.theta);
  std::vector<float> q = values(p.T * p.Hq * p.D, 1), k = values(p.T * p.Hkv * p.D, 2);
  const std::vector<double> q_want = reference(widen(q), p.T, p.Hq, p.D, p.offset, p.theta);
  const std::vector<double> k_want = reference(widen(k), p.T, p.Hkv, p.D, p.offset, p.theta);
  ops::rope_forward(dev, dev.compute_stream(), q.data(), k.data(), cos.data(), sin.data(), p.T, p.Hq,
                    p.Hkv, p.D);
  EXPECT_LT(rel_error(q, q_want), 1e-6);
  EXPECT_LT(rel_error(k, k_want), 1e-6);
}

TEST_P(Rope, BackwardUndoesForward) {
  const Shape p = GetParam();
  CpuDevice dev(1 << 20);
  std::vector<float> cos(ops::rope_table_elems(p.T, p.D)), sin(cos.size());
  ops::rope_tables(dev, dev.compute_stream(), cos.data(), sin.data(), p.T, p.D, p.offset, p.theta);
  const std::vector<float> q0 = values(p.T * p.Hq * p.D, 3), k0 = values(p.T * p.Hkv * p.D, 4);
  std::vector<float> q = q0, k = k0;
  ops::rope_forward(dev, dev.compute_stream(), q.data(), k.data(), cos.data(), sin.data(), p.T, p.Hq,
                    p.Hkv, p.D);
  ops::rope_backward(dev, dev.compute_stream(), q.data(), k.data(), cos.data(), sin.data(), p.T, p.Hq,
                     p.Hkv, p.D);
  EXPECT_LT(rel_error(q, widen(q0)), 1e-6);
  EXPECT_LT(rel_error(k, widen(k0)), 1e-6);
}

// L = sum(g * rope(x)); dL/dx by central differences of the double reference (exact
// up to rounding: rope is linear in x) against rope_backward(g).
TEST_P(Rope, BackwardMatchesFiniteDifferences) {
  const Shape p = GetParam();
  CpuDevice dev(1 << 20);
  std::vector<float> cos(ops::rope_table_elems(p.T, p.D)), sin(cos.size());
  ops::rope_tables(dev, dev.compute_stream(), cos.data(), sin.data(), p.T, p.D, p.offset, p.theta);
  const std::int64_t n = p.T * p.Hq * p.D;
  const std::vector<float> x = values(n, 5), g = values(n, 6);
  std::vector<double> want(n);
  const double eps = 1e-3;
  for (std::int64_t j = 0; j < n; ++j) {
    std::vector<double> xp = widen(x), xm = widen(x);
    xp[j] += eps;
    xm[j] -= eps;
    const std::vector<double> yp = reference(xp, p.T, p.Hq, p.D, p.offset, p.theta);
    const std::vector<double> ym = reference(xm, p.T, p.Hq, p.D, p.offset, p.theta);
    double l = 0;
    for (std::int64_t i = 0; i < n; ++i) l += g[i] * (yp[i] - ym[i]);
    want[j] = l / (2 * eps);
  }
  std::vector<float> dx = g;
  ops::rope_backward(dev, dev.compute_stream(), dx.data(), nullptr, cos.data(), sin.data(), p.T, p.Hq,
                     0, p.D);
  EXPECT_LT(rel_error(dx, want), 1e-5);
}

class RopeBf16 : public ::testing::TestWithParam<Shape> {};

// got's bits are the rounding of want's, element by element.
void expect_rounded(const std::vector<bf16>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i].bits, to_bf16(want[i]).bits) << what << " element " << i << ": f32 " << want[i];
}

// bf16 q / k rotated in place: bitwise to_bf16(the f32 rotation of the widened values),
// forward and backward (a double rounding or a rotation of unwidened bits would differ).
TEST_P(RopeBf16, IsTheRoundedF32Rotation) {
  const Shape p = GetParam();
  CpuDevice dev(1 << 20);
  Stream& s = dev.compute_stream();
  std::vector<float> cos(ops::rope_table_elems(p.T, p.D)), sin(cos.size());
  ops::rope_tables(dev, s, cos.data(), sin.data(), p.T, p.D, p.offset, p.theta);
  for (const bool forward : {true, false}) {
    std::vector<bf16> q = rounded(values(p.T * p.Hq * p.D, 7)), k = rounded(values(p.T * p.Hkv * p.D, 8));
    std::vector<float> qf = widened(q), kf = widened(k);
    if (forward) {
      ops::rope_forward(dev, s, qf.data(), kf.data(), cos.data(), sin.data(), p.T, p.Hq, p.Hkv, p.D);
      ops::rope_forward(dev, s, q.data(), k.data(), cos.data(), sin.data(), p.T, p.Hq, p.Hkv, p.D);
    } else {
      ops::rope_backward(dev, s, qf.data(), kf.data(), cos.data(), sin.data(), p.T, p.Hq, p.Hkv, p.D);
      ops::rope_backward(dev, s, q.data(), k.data(), cos.data(), sin.data(), p.T, p.Hq, p.Hkv, p.D);
    }
    expect_rounded(q, qf, forward ? "forward q" : "backward dq");
    expect_rounded(k, kf, forward ? "forward k" : "backward dk");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         ::testing::Values(Shape{7, 3, 1, 10, 0, 10000.0},   // odd T, D/2 odd
                                           Shape{5, 4, 2, 8, 1021, 1e6},     // offset, Qwen3 theta
                                           Shape{1, 1, 1, 2, 0, 10000.0},    // smallest
                                           Shape{13, 2, 2, 64, 3, 500000.0}));

INSTANTIATE_TEST_SUITE_P(Shapes, RopeBf16,
                         ::testing::Values(Shape{7, 3, 1, 10, 0, 10000.0},    // odd T, D/2 odd
                                           Shape{5, 4, 2, 8, 1021, 1e6},      // offset, Qwen3 theta
                                           Shape{1, 1, 1, 2, 0, 10000.0},     // smallest
                                           Shape{13, 2, 2, 64, 3, 500000.0},  // a real head dim
                                           Shape{0, 2, 1, 6, 0, 10000.0},     // no tokens
                                           Shape{3, 5, 0, 34, 17, 10000.0})); // no k heads, D/2 = 17

TEST(RopeTables, PositionZeroIsIdentityAndLastColumnIsSlowest) {
  std::vector<float> cos(4 * 3), sin(4 * 3);
  CpuDevice dev(1 << 20);
  ops::rope_tables(dev, dev.compute_stream(), cos.data(), sin.data(), 4, 6, 0, 10000.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cos[i], 1.0f);
    EXPECT_EQ(sin[i], 0.0f);
  }
  EXPECT_EQ(sin[3], static_cast<float>(std::sin(1.0)));  // t=1, i=0: angle 1
  EXPECT_EQ(sin[5], static_cast<float>(std::sin(std::pow(10000.0, -4.0 / 6.0))));
}

TEST(RopeTables, OddHeadDimIsRefused) {
  CpuDevice dev(1 << 20);
  std::vector<float> buf(64);
  auto msg = [](auto f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string m = msg([&] {
    ops::rope_forward(dev, dev.compute_stream(), buf.data(), buf.data(), buf.data(), buf.data(), 2, 1, 1, 5);
  });
  EXPECT_NE(m.find("head dim must be even"), std::string::npos) << m;
  EXPECT_NE(m.find("5"), std::string::npos) << m;
  EXPECT_THROW(ops::rope_tables(dev, dev.compute_stream(), buf.data(), buf.data(), 2, 3, 0, 1e4),
               InvalidArgument);
  EXPECT_THROW(ops::rope_table_elems(2, 7), InvalidArgument);
  EXPECT_THROW(ops::rope_tables(dev, dev.compute_stream(), buf.data(), buf.data(), 2, 4, 0, 0.0),
               InvalidArgument);
  EXPECT_THROW(ops::rope_backward(dev, dev.compute_stream(), buf.data(), buf.data(), buf.data(),
                                  buf.data(), 2, -1, 1, 4),
               InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
