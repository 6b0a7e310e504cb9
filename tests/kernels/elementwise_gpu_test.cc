// The CUDA backend's elementwise, SwiGLU and RMSNorm kernels against the CPU backend on
// the same inputs through the same ops:: calls: what is written and what is added into
// must match (the added-into outputs start from non-zero values), at odd sizes (1, a
// partial block, rows wider than a block). Skips without a GPU.
//
// The bf16 forms, two checks each. On the GPU, the convention itself: every bf16 output
// is bitwise to_bf16 of the CUDA f32 kernel's output on the widened inputs, every fp32
// output (rstd, dweight) bitwise the CUDA f32 kernel's. Against the CPU backend: convert,
// fill and add bitwise (integer rounding on both, no fused arithmetic); axpy, SwiGLU and
// RMSNorm within the f32 comparison's tolerance plus one bf16 step (2^-7 relative: two
// f32 results a hair apart can straddle a rounding boundary and land one bf16 apart).
#include <cstdint>
#include <cstring>

#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/swiglu.h"
#include "tests/device/gpu_test_util.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::rounded;
using test_bf16::widened;

using testing::f;
using testing::randn;
using testing::same_on_both;

using Bytes = std::vector<std::uint8_t>;

template <typename T>
Bytes bytes_of(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename T>
std::vector<T> as(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

template <typename T>
T* p(Buffer& b) { return static_cast<T*>(b.data()); }

std::vector<std::uint16_t> bits16(const Bytes& b) { return as<std::uint16_t>(b); }

// Uploads inputs to dev, runs body, returns every buffer's bytes afterwards.
std::vector<Bytes> run_on(Device& dev, const std::vector<Bytes>& inputs,
                          const std::function<void(Device&, std::vector<Buffer>&)>& body) {
  std::vector<Buffer> bufs;
  for (const Bytes& in : inputs) bufs.push_back(testing::upload(dev, in));
  body(dev, bufs);
  std::vector<Bytes> out;
  dev.wait(dev.copy_stream(), dev.record(dev.compute_stream()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    out.emplace_back(inputs[i].size());
    dev.memcpy_async(out.back().data(), bufs[i].data(), inputs[i].size(), CopyKind::device_to_host, dev.copy_stream());
  }
  dev.synchronize(dev.copy_stream());
  return out;
}

struct BothRuns {
  std::vector<Bytes> cpu, gpu;
};

BothRuns run_on_both(const std::vector<Bytes>& inputs, const std::function<void(Device&, std::vector<Buffer>&)>& body) {
  CudaDevice gpu(256 * testing::kMiB);
  CpuDevice cpu(256 * testing::kMiB);
  return {run_on(cpu, inputs, body), run_on(gpu, inputs, body)};
}

constexpr float kBf16Step = 1.0f / 128;

// On the GPU, bf16 buffer `b` is bitwise the f32 buffer `f` rounded; against the CPU,
// bitwise (rel < 0) or within rel.
void expect_bf16_form(const BothRuns& r, std::size_t b, std::size_t f, float rel, const std::string& what) {
  EXPECT_EQ(bits16(r.gpu[b]), bits16(bytes_of(rounded(as<float>(r.gpu[f]))))) << what << ": bf16 is the f32 rounded";
  if (rel < 0) {
    EXPECT_EQ(bits16(r.gpu[b]), bits16(r.cpu[b])) << what << ": cuda vs cpu";
  } else {
    testing::expect_close(widened(as<bf16>(r.gpu[b])), widened(as<bf16>(r.cpu[b])), rel, what + ": cuda vs cpu");
  }
}

// An fp32 output of a bf16 form: bitwise the f32 form's on the GPU, within rel of the CPU.
void expect_f32_of_bf16_form(const BothRuns& r, std::size_t b, std::size_t f, float rel, const std::string& what) {
  EXPECT_EQ(as<std::uint32_t>(r.gpu[b]), as<std::uint32_t>(r.gpu[f])) << what << ": fp32 output is the f32 form's";
  testing::expect_close(as<float>(r.gpu[b]), as<float>(r.cpu[b]), rel, what + ": cuda vs cpu");
}

TEST(CudaKernels, ElementwiseMatchCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 255, 257, 100003}) {
    const auto z = static_cast<std::size_t>(n);
    same_on_both({randn(z, 1), randn(z, 2), randn(z, 3)}, [n](Device& dev, std::vector<Buffer>& b) {
      Stream& s = dev.compute_stream();
      ops::axpy(dev, s, f(b[0]), f(b[1]), n, 0.5f);
      ops::scale(dev, s, f(b[1]), n, -3.0f);
      ops::add(dev, s, f(b[2]), f(b[0]), f(b[1]), n);
    }, 1e-6f, "axpy/scale/add n " + std::to_string(n));
    same_on_both({randn(z, 4)}, [n](Device& dev, std::vector<Buffer>& b) {
      ops::fill(dev, dev.compute_stream(), f(b[0]), n, 1.25f);
    }, 0.0f, "fill");
  }
}

TEST(CudaKernels, SwigluMatchesCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 1000, 65537}) {
    const auto z = static_cast<std::size_t>(n);
    same_on_both({randn(z, 5), randn(z, 6), randn(z, 7), randn(z, 8), randn(z, 9), randn(z, 10)},
                 [n](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::swiglu_forward(dev, s, f(b[0]), f(b[1]), f(b[2]), n);
                   ops::swiglu_backward(dev, s, f(b[3]), f(b[4]), f(b[5]), f(b[1]), f(b[2]), n);
                 }, 2e-6f, "swiglu n " + std::to_string(n));
  }
}

TEST(CudaKernels, RmsnormMatchesCpuAndAddsIntoItsGradients) {
  PB_NEED_GPU();
  for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 7}, {17, 256}, {5, 1000}, {64, 4099}}) {
    const auto nc = static_cast<std::size_t>(n * c), zc = static_cast<std::size_t>(c), zn = static_cast<std::size_t>(n);
    // x, weight, out, rstd, dout, dx (starts non-zero: added into), dweight (likewise)
    same_on_both({randn(nc, 11), randn(zc, 12), randn(nc, 13), randn(zn, 14), randn(nc, 15), randn(nc, 16), randn(zc, 17)},
                 [n, c](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::rmsnorm_forward(dev, s, f(b[2]), f(b[3]), f(b[0]), f(b[1]), n, c, 1e-5f);
                   ops::rmsnorm_backward(dev, s, f(b[5]), f(b[6]), f(b[4]), f(b[0]), f(b[1]), f(b[3]), n, c);
                 }, 1e-5f, "rmsnorm " + std::to_string(n) + "x" + std::to_string(c));
  }
}

TEST(CudaKernels, ConvertIsBitwiseTheCpuOnEveryPattern) {
  PB_NEED_GPU();
  std::vector<float> f;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      f.push_back(bits_float(hi << 16 | lo));
  std::vector<bf16> h(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) h[i].bits = static_cast<std::uint16_t>(i);
  const auto nf = static_cast<std::int64_t>(f.size());
  // f, its bf16, every bf16, their f32.
  const BothRuns r = run_on_both({bytes_of(f), bytes_of(std::vector<bf16>(f.size())), bytes_of(h),
                                  bytes_of(std::vector<float>(h.size()))},
                                 [nf](Device& dev, std::vector<Buffer>& b) {
                                   Stream& s = dev.compute_stream();
                                   ops::convert(dev, s, p<bf16>(b[1]), p<float>(b[0]), nf);
                                   ops::convert(dev, s, p<float>(b[3]), p<bf16>(b[2]), 65536);
                                 });
  EXPECT_EQ(bits16(r.gpu[1]), bits16(bytes_of(rounded(f))));
  EXPECT_EQ(bits16(r.gpu[1]), bits16(r.cpu[1]));
  EXPECT_EQ(as<std::uint32_t>(r.gpu[3]), as<std::uint32_t>(bytes_of(widened(h))));
}

TEST(CudaKernels, Bf16ElementwiseRoundTheF32KernelsAndMatchCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 255, 257, 100003}) {
    const auto z = static_cast<std::size_t>(n);
    const auto a = rounded(randn(z, 1)), b = rounded(randn(z, 2)), y = rounded(randn(z, 3));
    // 0 a, 1 b, 2 y, 3 out, 4 filled (bf16); 5 a, 6 b, 7 y, 8 out, 9 filled (their f32 forms)
    const BothRuns r = run_on_both(
        {bytes_of(a), bytes_of(b), bytes_of(y), bytes_of(std::vector<bf16>(z)), bytes_of(std::vector<bf16>(z)),
         bytes_of(widened(a)), bytes_of(widened(b)), bytes_of(widened(y)), bytes_of(std::vector<float>(z)),
         bytes_of(std::vector<float>(z))},
        [n](Device& dev, std::vector<Buffer>& v) {
          Stream& s = dev.compute_stream();
          ops::axpy(dev, s, p<bf16>(v[2]), p<bf16>(v[0]), n, 0.37f);
          ops::add(dev, s, p<bf16>(v[3]), p<bf16>(v[0]), p<bf16>(v[1]), n);
          ops::fill(dev, s, p<bf16>(v[4]), n, 1.00390625f);
          ops::axpy(dev, s, p<float>(v[7]), p<float>(v[5]), n, 0.37f);
          ops::add(dev, s, p<float>(v[8]), p<float>(v[5]), p<float>(v[6]), n);
          ops::fill(dev, s, p<float>(v[9]), n, 1.00390625f);
        });
    const std::string what = "n " + std::to_string(n);
    expect_bf16_form(r, 2, 7, 1e-6f + kBf16Step, "axpy " + what);
    expect_bf16_form(r, 3, 8, -1, "add " + what);
    expect_bf16_form(r, 4, 9, -1, "fill " + what);
  }
}

TEST(CudaKernels, Bf16SwigluRoundsTheF32KernelAndMatchesCpu) {
  PB_NEED_GPU();
  for (std::int64_t n : {1, 1000, 65537}) {
    const auto z = static_cast<std::size_t>(n);
    const auto g = rounded(randn(z, 5)), u = rounded(randn(z, 6)), d = rounded(randn(z, 7));
    const Bytes zb = bytes_of(std::vector<bf16>(z)), zf = bytes_of(std::vector<float>(z));
    // 0 gate, 1 up, 2 dout, 3 out, 4 dgate, 5 dup (bf16); 6..11 the same in f32
    const BothRuns r = run_on_both(
        {bytes_of(g), bytes_of(u), bytes_of(d), zb, zb, zb, bytes_of(widened(g)), bytes_of(widened(u)),
         bytes_of(widened(d)), zf, zf, zf},
        [n](Device& dev, std::vector<Buffer>& v) {
          Stream& s = dev.compute_stream();
          ops::swiglu_forward(dev, s, p<bf16>(v[3]), p<bf16>(v[0]), p<bf16>(v[1]), n);
          ops::swiglu_backward(dev, s, p<bf16>(v[4]), p<bf16>(v[5]), p<bf16>(v[2]), p<bf16>(v[0]), p<bf16>(v[1]), n);
          ops::swiglu_forward(dev, s, p<float>(v[9]), p<float>(v[6]), p<float>(v[7]), n);
          ops::swiglu_backward(dev, s, p<float>(v[10]), p<float>(v[11]), p<float>(v[8]), p<float>(v[6]),
                               p<float>(v[7]), n);
        });
    for (std::size_t i = 3; i < 6; ++i)
      expect_bf16_form(r, i, i + 6, 2e-6f + kBf16Step,
                       "swiglu n " + std::to_string(n) + " buffer " + std::to_string(i));
  }
}

TEST(CudaKernels, Bf16RmsnormRoundsTheF32KernelAndMatchesCpu) {
  PB_NEED_GPU();
  for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 7}, {17, 256}, {5, 1000}, {64, 4099}}) {
    const auto nc = static_cast<std::size_t>(n * c), zc = static_cast<std::size_t>(c), zn = static_cast<std::size_t>(n);
    const auto x = rounded(randn(nc, 11)), w = rounded(randn(zc, 12)), dout = rounded(randn(nc, 15));
    const auto dx = rounded(randn(nc, 16));  // added into: starts non-zero
    const auto dw = randn(zc, 17);           // fp32 for both forms, added into
    // 0 x, 1 w, 2 out, 3 dout, 4 dx (bf16), 5 rstd, 6 dweight (fp32); 7..13 the f32 form's
    const BothRuns r = run_on_both(
        {bytes_of(x), bytes_of(w), bytes_of(std::vector<bf16>(nc)), bytes_of(dout), bytes_of(dx),
         bytes_of(std::vector<float>(zn)), bytes_of(dw), bytes_of(widened(x)), bytes_of(widened(w)),
         bytes_of(std::vector<float>(nc)), bytes_of(widened(dout)), bytes_of(widened(dx)),
         bytes_of(std::vector<float>(zn)), bytes_of(dw)},
        [n, c](Device& dev, std::vector<Buffer>& v) {
          Stream& s = dev.compute_stream();
          ops::rmsnorm_forward(dev, s, p<bf16>(v[2]), p<float>(v[5]), p<bf16>(v[0]), p<bf16>(v[1]), n, c, 1e-5f);
          ops::rmsnorm_backward(dev, s, p<bf16>(v[4]), p<float>(v[6]), p<bf16>(v[3]), p<bf16>(v[0]), p<bf16>(v[1]),
                                p<float>(v[5]), n, c);
          ops::rmsnorm_forward(dev, s, p<float>(v[9]), p<float>(v[12]), p<float>(v[7]), p<float>(v[8]), n, c, 1e-5f);
          ops::rmsnorm_backward(dev, s, p<float>(v[11]), p<float>(v[13]), p<float>(v[10]), p<float>(v[7]),
                                p<float>(v[8]), p<float>(v[12]), n, c);
        });
    const std::string what = "rmsnorm " + std::to_string(n) + "x" + std::to_string(c);
    expect_bf16_form(r, 2, 9, 1e-5f + kBf16Step, what + " out");
    expect_bf16_form(r, 4, 11, 1e-5f + kBf16Step, what + " dx");
    expect_f32_of_bf16_form(r, 5, 12, 1e-5f, what + " rstd");
    expect_f32_of_bf16_form(r, 6, 13, 1e-5f, what + " dweight");
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
