// The CUDA backend's attention against the CPU backend's on the same inputs: causal GQA
// with and without a window, odd sizes, Dv != D; and a sequence split into two key
// blocks at offsets, folded with accumulate (forward running state, gradients added
// into), as ring attention calls it. The bf16 forms (bf16 q, k, v, dout, saved out; fp32
// out, lse, gradients) the same way, within the bf16 bound. Skips without a GPU.
#include <cstring>

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/ops/attention.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::f;
using testing::randn;
using testing::same_on_both;

struct Shape {
  std::int64_t T, Hq, Hkv, D, Dv, W;
};

// Head dims up to 64 run the tiled kernels (64 rows a block, 32 staged a tile: T 300 is
// five query blocks, the last partial, and keys in tiles that do not divide it), 128 the
// simple ones.
TEST(CudaKernels, AttentionMatchesCpu) {
  PB_NEED_GPU();
  for (Shape sh : {Shape{1, 1, 1, 8, 8, 0}, Shape{37, 4, 2, 64, 48, 0}, Shape{70, 6, 2, 32, 32, 5},
                   Shape{300, 4, 2, 32, 24, 0}, Shape{300, 4, 1, 20, 32, 77}, Shape{150, 2, 1, 64, 64, 0},
                   Shape{129, 3, 3, 33, 17, 40}, Shape{100, 2, 2, 128, 96, 0}}) {
    ops::AttentionDims a;
    a.tokens = sh.T, a.q_heads = sh.Hq, a.kv_heads = sh.Hkv, a.qk_dim = sh.D, a.v_dim = sh.Dv, a.window = sh.W;
    a.block_q = 16, a.block_k = 16;
    const auto nq = static_cast<std::size_t>(sh.T * sh.Hq * sh.D), nk = static_cast<std::size_t>(sh.T * sh.Hkv * sh.D),
               nv = static_cast<std::size_t>(sh.T * sh.Hkv * sh.Dv), no = static_cast<std::size_t>(sh.T * sh.Hq * sh.Dv),
               nl = static_cast<std::size_t>(sh.T * sh.Hq),
               nw = static_cast<std::size_t>(attention_workspace_floats(a));
    // q, k, v, out, lse, dout, dq, dk, dv, workspace
    same_on_both({randn(nq, 1), randn(nk, 2), randn(nv, 3), randn(no, 4), randn(nl, 5), randn(no, 6), randn(nq, 7),
                  randn(nk, 8), randn(nv, 9), std::vector<float>(nw, 0.0f)},
                 [&](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::attention_forward(dev, s, f(b[3]), f(b[4]), f(b[0]), f(b[1]), f(b[2]), a, f(b[9]));
                   ops::attention_backward(dev, s, f(b[6]), f(b[7]), f(b[8]), f(b[5]), f(b[0]), f(b[1]), f(b[2]),
                                           f(b[3]), f(b[4]), a, f(b[9]));
                 }, 5e-5f, "attention T " + std::to_string(sh.T) + " W " + std::to_string(sh.W), {9});
  }
}

// Queries: the last Tq rows of a `keys`-token sequence; keys in two blocks [0, split) and
// [split, keys), folded as ring attention folds them.
struct Fold {
  std::int64_t H, D, Tq, keys, split;
};

TEST(CudaKernels, AttentionBlocksFoldWithAccumulate) {
  PB_NEED_GPU();
  for (Fold fo : {Fold{2, 16, 30, 50, 30}, Fold{3, 32, 200, 350, 181}}) {
    const std::int64_t H = fo.H, D = fo.D, Tq = fo.Tq, split = fo.split;
    ops::AttentionDims a;
    a.tokens = Tq, a.q_heads = H, a.kv_heads = H, a.qk_dim = D, a.v_dim = D, a.q_offset = fo.keys - Tq;
    a.accumulate = true;
    a.block_q = 8, a.block_k = 8;
    ops::AttentionDims b1 = a, b2 = a;
    b1.kv_tokens = split, b1.k_offset = 0;
    b2.kv_tokens = fo.keys - split, b2.k_offset = split;
    const auto nq = static_cast<std::size_t>(Tq * H * D), nl = static_cast<std::size_t>(Tq * H),
               nk = static_cast<std::size_t>(fo.keys * H * D);
    const auto nw = static_cast<std::size_t>(std::max(attention_workspace_floats(b1), attention_workspace_floats(b2)));
    std::vector<float> lse0(nl, -INFINITY);
    // q, k (all key rows), v, out, lse, dout, dq, dk, dv, workspace, row_dot
    same_on_both({randn(nq, 1), randn(nk, 2), randn(nk, 3), randn(nq, 4), lse0, randn(nq, 6), randn(nq, 7),
                  randn(nk, 8), randn(nk, 9), std::vector<float>(nw, 0.0f), randn(nl, 10)},
                 [&](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   float* k2 = f(b[1]) + split * H * D;
                   float* v2 = f(b[2]) + split * H * D;
                   ops::attention_forward(dev, s, f(b[3]), f(b[4]), f(b[0]), f(b[1]), f(b[2]), b1, f(b[9]));
                   ops::attention_forward(dev, s, f(b[3]), f(b[4]), f(b[0]), k2, v2, b2, f(b[9]));
                   ops::attention_row_dot(dev, s, f(b[10]), f(b[5]), f(b[3]), a);
                   ops::attention_backward(dev, s, f(b[6]), f(b[7]), f(b[8]), f(b[5]), f(b[0]), f(b[1]), f(b[2]),
                                           f(b[3]), f(b[4]), b1, f(b[9]), nullptr, f(b[10]));
                   ops::attention_backward(dev, s, f(b[6]), f(b[7]) + split * H * D, f(b[8]) + split * H * D, f(b[5]),
                                           f(b[0]), k2, v2, f(b[3]), f(b[4]), b2, f(b[9]), nullptr, f(b[10]));
                 }, 5e-5f, "attention blocks Tq " + std::to_string(Tq), {9});
  }
}

// n bf16 values (randn, rounded) in a float buffer of ceil(n / 2), as a device buffer
// holds a bf16 tensor.
std::vector<float> bf16_values(std::size_t n, std::uint32_t seed) {
  const std::vector<float> x = randn(n, seed);
  std::vector<bf16> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = to_bf16(x[i]);
  std::vector<float> buf((n + 1) / 2, 0.0f);
  std::memcpy(buf.data(), h.data(), n * sizeof(bf16));
  return buf;
}

bf16* h(Buffer& b) { return static_cast<bf16*>(b.data()); }

// Tolerance against the CPU, in the project's metric relative_error = max|cuda - cpu| /
// max|cpu| per output: the CPU's bf16 form rounds P and dS to bf16 for its tile GEMMs
// (at most 2^-8 relative an element), the CUDA kernels keep them in fp32, so the two
// differ by about 2^-8 of each output's scale. The CPU's f32 kernel on the widened inputs
// stands in for CUDA (the same fp32 math) at these shapes and inputs: 2.3e-3 at worst
// (dq), so 1e-2 leaves 4x room. Per element (same_on_both's |a - b| <= tol (1 + |b|))
// the same runs reach 9e-2 on small dk elements whose terms are large, so the bf16
// comparison is per output.
constexpr double kBf16Tol = 1e-2;

// Runs body on both devices from the same inputs and compares the `compare` buffers
// (f32) with relative_error.
void same_on_both_relative(const std::vector<std::vector<float>>& inputs,
                           const std::function<void(Device&, std::vector<Buffer>&)>& body, const std::string& what,
                           const std::vector<std::size_t>& compare) {
  CudaDevice gpu(256 * testing::kMiB);
  CpuDevice cpu(256 * testing::kMiB);
  std::vector<std::vector<float>> outs[2];
  Device* devs[2] = {&cpu, &gpu};
  for (int d = 0; d < 2; ++d) {
    std::vector<Buffer> bufs;
    for (const auto& v : inputs) bufs.push_back(testing::upload(*devs[d], v));
    body(*devs[d], bufs);
    for (std::size_t i : compare) outs[d].push_back(testing::download(*devs[d], bufs[i], inputs[i].size()));
  }
  for (std::size_t c = 0; c < compare.size(); ++c) {
    const double e = cpu::relative_error(outs[1][c].data(), outs[0][c].data(),
                                         static_cast<std::int64_t>(outs[0][c].size()));
    EXPECT_LE(e, kBf16Tol) << what << " buffer " << compare[c];
  }
}

TEST(CudaKernels, AttentionBf16MatchesCpu) {
  PB_NEED_GPU();
  for (Shape sh : {Shape{1, 1, 1, 8, 8, 0}, Shape{37, 4, 1, 64, 48, 0}, Shape{70, 8, 2, 32, 32, 5},
                   Shape{300, 8, 2, 32, 32, 0}, Shape{257, 4, 2, 64, 40, 90}}) {
    ops::AttentionDims a;
    a.tokens = sh.T, a.q_heads = sh.Hq, a.kv_heads = sh.Hkv, a.qk_dim = sh.D, a.v_dim = sh.Dv, a.window = sh.W;
    a.block_q = 16, a.block_k = 16;
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    const std::size_t nq = z(sh.T * sh.Hq * sh.D), nk = z(sh.T * sh.Hkv * sh.D), nv = z(sh.T * sh.Hkv * sh.Dv),
                      no = z(sh.T * sh.Hq * sh.Dv), nl = z(sh.T * sh.Hq),
                      nw = z(attention_workspace_floats(a, DType::bf16));
    // q, k, v (bf16), out, lse, dout (bf16), dq, dk, dv, workspace, saved out (bf16)
    same_on_both_relative({bf16_values(nq, 1), bf16_values(nk, 2), bf16_values(nv, 3), randn(no, 4), randn(nl, 5),
                  bf16_values(no, 6), randn(nq, 7), randn(nk, 8), randn(nv, 9), std::vector<float>(nw, 0.0f),
                  bf16_values(no, 10)},
                 [&](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::attention_forward(dev, s, f(b[3]), f(b[4]), h(b[0]), h(b[1]), h(b[2]), a, f(b[9]));
                   ops::attention_backward(dev, s, f(b[6]), f(b[7]), f(b[8]), h(b[5]), h(b[0]), h(b[1]), h(b[2]),
                                           h(b[10]), f(b[4]), a, f(b[9]));
                 }, "bf16 attention T " + std::to_string(sh.T) + " W " + std::to_string(sh.W), {3, 4, 6, 7, 8});
  }
}

TEST(CudaKernels, AttentionBf16BlocksFoldWithAccumulate) {
  PB_NEED_GPU();
  // Queries: rows [20, 50) of a 50-token sequence; keys in two blocks [0, 30) and [30, 50).
  const std::int64_t H = 2, D = 16, Tq = 30;
  ops::AttentionDims a;
  a.tokens = Tq, a.q_heads = H, a.kv_heads = H, a.qk_dim = D, a.v_dim = D, a.q_offset = 20, a.accumulate = true;
  a.block_q = 8, a.block_k = 8;
  ops::AttentionDims b1 = a, b2 = a;
  b1.kv_tokens = 30, b1.k_offset = 0;
  b2.kv_tokens = 20, b2.k_offset = 30;
  const auto nq = static_cast<std::size_t>(Tq * H * D), nl = static_cast<std::size_t>(Tq * H),
             nk = static_cast<std::size_t>(50 * H * D);
  const auto nw = static_cast<std::size_t>(
      std::max(attention_workspace_floats(b1, DType::bf16), attention_workspace_floats(b2, DType::bf16)));
  std::vector<float> lse0(nl, -INFINITY);
  // q, k (50 rows), v (bf16), out, lse, dout (bf16), dq, dk, dv, workspace, row_dot, saved out (bf16)
  same_on_both_relative({bf16_values(nq, 1), bf16_values(nk, 2), bf16_values(nk, 3), randn(nq, 4), lse0,
                         bf16_values(nq, 6), randn(nq, 7), randn(nk, 8), randn(nk, 9), std::vector<float>(nw, 0.0f),
                         randn(nl, 10), bf16_values(nq, 11)},
               [&](Device& dev, std::vector<Buffer>& b) {
                 Stream& s = dev.compute_stream();
                 const bf16* k2 = h(b[1]) + 30 * H * D;
                 const bf16* v2 = h(b[2]) + 30 * H * D;
                 ops::attention_forward(dev, s, f(b[3]), f(b[4]), h(b[0]), h(b[1]), h(b[2]), b1, f(b[9]));
                 ops::attention_forward(dev, s, f(b[3]), f(b[4]), h(b[0]), k2, v2, b2, f(b[9]));
                 ops::attention_row_dot(dev, s, f(b[10]), h(b[5]), h(b[11]), a);
                 ops::attention_backward(dev, s, f(b[6]), f(b[7]), f(b[8]), h(b[5]), h(b[0]), h(b[1]), h(b[2]),
                                         h(b[11]), f(b[4]), b1, f(b[9]), nullptr, f(b[10]));
                 ops::attention_backward(dev, s, f(b[6]), f(b[7]) + 30 * H * D, f(b[8]) + 30 * H * D, h(b[5]),
                                         h(b[0]), k2, v2, h(b[11]), f(b[4]), b2, f(b[9]), nullptr, f(b[10]));
               }, "bf16 attention blocks", {3, 4, 6, 7, 8, 10});
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
