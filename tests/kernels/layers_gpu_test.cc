// The CUDA backend's rotary embedding, token embedding and row gate against the CPU
// backend on the same inputs through the same ops:: calls: odd sizes, ids outside the
// shard, repeated ids (the embedding gradient adds them in order), the gate written
// and added into. Skips without a GPU. The bf16 forms the same way: CUDA's bf16 buffers
// against the CPU's, bitwise for the embedding, within one bf16 rounding elsewhere.
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/ops/embedding.h"
#include "peakbound/ops/rope.h"
#include "peakbound/ops/row_gate.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::f;
using testing::randn;
using testing::same_on_both;

TEST(CudaKernels, RopeMatchesCpu) {
  PB_NEED_GPU();
  for (auto [t, hq, hkv, d, off] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>{1, 1, 1, 2, 0},
                                    {7, 4, 2, 64, 5}, {33, 3, 1, 128, 1000}}) {
    const auto half = static_cast<std::size_t>(t * d / 2);
    same_on_both({randn(half, 1), randn(half, 2), randn(static_cast<std::size_t>(t * hq * d), 3),
                  randn(static_cast<std::size_t>(t * hkv * d), 4), randn(static_cast<std::size_t>(t * hq * d), 5),
                  randn(static_cast<std::size_t>(t * hkv * d), 6)},
                 [=](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::rope_tables(dev, s, f(b[0]), f(b[1]), t, d, off, 1e6);
                   ops::rope_forward(dev, s, f(b[2]), f(b[3]), f(b[0]), f(b[1]), t, hq, hkv, d);
                   ops::rope_backward(dev, s, f(b[4]), f(b[5]), f(b[0]), f(b[1]), t, hq, hkv, d);
                 }, 2e-6f, "rope t " + std::to_string(t));
  }
}

TEST(CudaKernels, EmbeddingMatchesCpuWithRepeatedAndForeignIds) {
  PB_NEED_GPU();
  const std::int64_t T = 37, H = 300, offset = 10, rows = 20;
  // ids as floats' bits: the buffers are float vectors; the ids ride in one of them.
  std::vector<float> ids(T);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t id = static_cast<std::int32_t>((t * 7) % 40);  // some below 10, some above 29, repeats
    std::memcpy(&ids[static_cast<std::size_t>(t)], &id, sizeof id);
  }
  same_on_both({ids, randn(static_cast<std::size_t>(rows * H), 1), randn(static_cast<std::size_t>(T * H), 2),
                randn(static_cast<std::size_t>(T * H), 3), randn(static_cast<std::size_t>(rows * H), 4)},
               [=](Device& dev, std::vector<Buffer>& b) {
                 Stream& s = dev.compute_stream();
                 const auto* id = static_cast<const std::int32_t*>(b[0].data());
                 ops::embedding_forward(dev, s, f(b[2]), id, f(b[1]), T, H, offset, rows);
                 ops::embedding_backward(dev, s, f(b[4]), id, f(b[3]), T, H, offset, rows);
               }, 0.0f, "embedding");  // a copy and in-order sums: bitwise
}

TEST(CudaKernels, RowGateMatchesCpu) {
  PB_NEED_GPU();
  for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {5, 300}, {64, 1024}}) {
    const auto mn = static_cast<std::size_t>(m * n), zm = static_cast<std::size_t>(m);
    for (bool acc : {false, true})
      same_on_both({randn(mn, 1), randn(zm, 2), randn(mn, 3), randn(mn, 4), randn(mn, 5), randn(zm, 6)},
                   [=](Device& dev, std::vector<Buffer>& b) {
                     Stream& s = dev.compute_stream();
                     ops::row_gate_forward(dev, s, f(b[2]), f(b[0]), f(b[1]), m, n, acc);
                     ops::row_gate_backward(dev, s, f(b[4]), f(b[5]), f(b[3]), f(b[0]), f(b[1]), m, n);
                   }, 2e-6f, "row_gate " + std::to_string(m) + "x" + std::to_string(n));
  }
}

// A buffer of the bf16 tests: bf16 (the values rounded to nearest even on upload) or fp32.
struct HostBuf {
  std::vector<float> values;
  bool is_bf16 = true;
};

HostBuf fp32(std::vector<float> v) { return {std::move(v), false}; }

bf16* h(Buffer& b) { return static_cast<bf16*>(b.data()); }

// b's elements as floats (bf16 widened exactly), after the compute stream's work.
std::vector<float> download_widened(Device& dev, const Buffer& b, const HostBuf& in) {
  if (!in.is_bf16) return testing::download(dev, b, in.values.size());
  std::vector<bf16> raw(in.values.size());
  dev.wait(dev.copy_stream(), dev.record(dev.compute_stream()));
  dev.memcpy_async(raw.data(), b.data(), raw.size() * sizeof(bf16), CopyKind::device_to_host, dev.copy_stream());
  dev.synchronize(dev.copy_stream());
  std::vector<float> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = to_f32(raw[i]);
  return out;
}

// same_on_both over bf16 and fp32 buffers: rel 0 compares bits, else testing::expect_close.
void bf16_on_both(const std::vector<HostBuf>& inputs, const std::function<void(Device&, std::vector<Buffer>&)>& body,
                  float rel, const std::string& what) {
  CudaDevice gpu(256 * testing::kMiB);
  CpuDevice cpu(256 * testing::kMiB);
  std::vector<std::vector<float>> outs[2];
  Device* devs[2] = {&cpu, &gpu};
  for (int d = 0; d < 2; ++d) {
    std::vector<Buffer> bufs;
    for (const HostBuf& in : inputs) {
      if (!in.is_bf16) {
        bufs.push_back(testing::upload(*devs[d], in.values));
        continue;
      }
      std::vector<bf16> r(in.values.size());
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = to_bf16(in.values[i]);
      bufs.push_back(testing::upload(*devs[d], r));
    }
    body(*devs[d], bufs);
    for (std::size_t i = 0; i < inputs.size(); ++i) outs[d].push_back(download_widened(*devs[d], bufs[i], inputs[i]));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string at = what + " buffer " + std::to_string(i);
    if (rel > 0) {
      testing::expect_close(outs[1][i], outs[0][i], rel, at);
      continue;
    }
    ASSERT_EQ(outs[1][i].size(), outs[0][i].size()) << at;
    for (std::size_t j = 0; j < outs[0][i].size(); ++j)
      ASSERT_EQ(float_bits(outs[1][i][j]), float_bits(outs[0][i][j])) << at << " element " << j;
  }
}

// The f32 kernels differ from the CPU's by nvcc's FMA contraction (and expf's last bit in
// the gate), ~1e-6 relative; rounded to bf16, two such values differ by at most one bf16
// unit in the last place, 2^-7 of the value's binade: the bound below.
constexpr float kOneBf16Ulp = 1.0f / 128;

TEST(CudaKernels, RopeBf16MatchesCpu) {
  PB_NEED_GPU();
  using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  // D = 34: D/2 = 17, not a multiple of a warp or a vector width.
  for (auto [t, hq, hkv, d, off] : {Shape{1, 1, 1, 2, 0}, Shape{7, 4, 2, 34, 5}, Shape{33, 3, 1, 128, 1000}}) {
    const auto half = static_cast<std::size_t>(t * d / 2);
    const auto q = static_cast<std::size_t>(t * hq * d), k = static_cast<std::size_t>(t * hkv * d);
    bf16_on_both({fp32(randn(half, 1)), fp32(randn(half, 2)), {randn(q, 3)}, {randn(k, 4)}, {randn(q, 5)},
                  {randn(k, 6)}},
                 [=](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   ops::rope_tables(dev, s, f(b[0]), f(b[1]), t, d, off, 1e6);
                   ops::rope_forward(dev, s, h(b[2]), h(b[3]), f(b[0]), f(b[1]), t, hq, hkv, d);
                   ops::rope_backward(dev, s, h(b[4]), h(b[5]), f(b[0]), f(b[1]), t, hq, hkv, d);
                 }, kOneBf16Ulp, "rope bf16 t " + std::to_string(t));
  }
}

TEST(CudaKernels, EmbeddingBf16MatchesCpuBitwise) {
  PB_NEED_GPU();
  const std::int64_t T = 37, H = 300, offset = 10, rows = 20;
  std::vector<float> ids(T);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t id = static_cast<std::int32_t>((t * 7) % 40);  // some below 10, some above 29, repeats
    std::memcpy(&ids[static_cast<std::size_t>(t)], &id, sizeof id);
  }
  bf16_on_both({fp32(ids), {randn(static_cast<std::size_t>(rows * H), 1)}, {randn(static_cast<std::size_t>(T * H), 2)},
                {randn(static_cast<std::size_t>(T * H), 3)}, fp32(randn(static_cast<std::size_t>(rows * H), 4))},
               [=](Device& dev, std::vector<Buffer>& b) {
                 Stream& s = dev.compute_stream();
                 const auto* id = static_cast<const std::int32_t*>(b[0].data());
                 ops::embedding_forward(dev, s, h(b[2]), id, h(b[1]), T, H, offset, rows);
                 ops::embedding_backward(dev, s, f(b[4]), id, h(b[3]), T, H, offset, rows);
               }, 0.0f, "embedding bf16");  // a copy and in-order fp32 sums of exact widenings: bitwise
}

TEST(CudaKernels, RowGateBf16MatchesCpu) {
  PB_NEED_GPU();
  for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {5, 300}, {64, 1024}}) {
    const auto mn = static_cast<std::size_t>(m * n), zm = static_cast<std::size_t>(m);
    for (bool acc : {false, true})
      bf16_on_both({{randn(mn, 1)}, fp32(randn(zm, 2)), {randn(mn, 3)}, {randn(mn, 4)}, {randn(mn, 5)}, {randn(zm, 6)}},
                   [=](Device& dev, std::vector<Buffer>& b) {
                     Stream& s = dev.compute_stream();
                     ops::row_gate_forward(dev, s, h(b[2]), h(b[0]), f(b[1]), m, n, acc);
                     ops::row_gate_backward(dev, s, h(b[4]), h(b[5]), h(b[3]), h(b[0]), f(b[1]), m, n);
                   }, kOneBf16Ulp, "row_gate bf16 " + std::to_string(m) + "x" + std::to_string(n));
  }
}

// On the GPU alone, the convention itself: each bf16 output is bitwise to_bf16(the CUDA
// f32 kernel's output on the widened inputs), and the fp32 dtable the f32 kernel's.
// fp32 buffers (tables, z, dtable) are shared by both runs.
TEST(CudaKernels, Bf16FormsAreTheRoundedF32FormsOnCuda) {
  PB_NEED_GPU();
  CudaDevice gpu(256 * testing::kMiB);
  Stream& s = gpu.compute_stream();
  // bf16 values and their exact widening, on the device.
  auto pair = [&](std::size_t n, std::uint32_t seed) {
    std::vector<float> v = randn(n, seed);
    std::vector<bf16> r(n);
    for (std::size_t i = 0; i < n; ++i) {
      r[i] = to_bf16(v[i]);
      v[i] = to_f32(r[i]);
    }
    return std::pair<Buffer, Buffer>{testing::upload(gpu, r), testing::upload(gpu, v)};
  };
  auto expect_rounded = [&](const Buffer& b, const Buffer& wide, std::size_t n, const std::string& what) {
    const std::vector<float> got = download_widened(gpu, b, HostBuf{std::vector<float>(n), true});
    const std::vector<float> want = testing::download(gpu, wide, n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(to_bf16(got[i]).bits, to_bf16(want[i]).bits) << what << " element " << i << ": f32 " << want[i];
  };
  {  // RoPE: D/2 = 17.
    const std::int64_t t = 9, hq = 3, hkv = 2, d = 34;
    const auto half = static_cast<std::size_t>(t * d / 2), nq = static_cast<std::size_t>(t * hq * d),
               nk = static_cast<std::size_t>(t * hkv * d);
    Buffer cos_t = testing::upload(gpu, std::vector<float>(half));
    Buffer sin_t = testing::upload(gpu, std::vector<float>(half));
    ops::rope_tables(gpu, s, f(cos_t), f(sin_t), t, d, 11, 1e4);
    for (const bool fwd : {true, false}) {
      auto [q, qw] = pair(nq, 1);
      auto [k, kw] = pair(nk, 2);
      if (fwd) {
        ops::rope_forward(gpu, s, h(q), h(k), f(cos_t), f(sin_t), t, hq, hkv, d);
        ops::rope_forward(gpu, s, f(qw), f(kw), f(cos_t), f(sin_t), t, hq, hkv, d);
      } else {
        ops::rope_backward(gpu, s, h(q), h(k), f(cos_t), f(sin_t), t, hq, hkv, d);
        ops::rope_backward(gpu, s, f(qw), f(kw), f(cos_t), f(sin_t), t, hq, hkv, d);
      }
      expect_rounded(q, qw, nq, fwd ? "rope q" : "rope dq");
      expect_rounded(k, kw, nk, fwd ? "rope k" : "rope dk");
    }
  }
  {  // Row gate, written and accumulated; backward.
    const std::int64_t m = 7, n = 300;
    const auto mn = static_cast<std::size_t>(m * n), mm = static_cast<std::size_t>(m);
    Buffer z = testing::upload(gpu, randn(mm, 3));
    auto [x, xw] = pair(mn, 4);
    auto [dout, doutw] = pair(mn, 5);
    for (const bool acc : {false, true}) {
      auto [out, outw] = pair(mn, 6);
      ops::row_gate_forward(gpu, s, h(out), h(x), f(z), m, n, acc);
      ops::row_gate_forward(gpu, s, f(outw), f(xw), f(z), m, n, acc);
      expect_rounded(out, outw, mn, acc ? "row_gate out accumulated" : "row_gate out");
    }
    auto [dx, dxw] = pair(mn, 7);
    auto [dz, dzw] = pair(mm, 8);
    ops::row_gate_backward(gpu, s, h(dx), h(dz), h(dout), h(x), f(z), m, n);
    ops::row_gate_backward(gpu, s, f(dxw), f(dzw), f(doutw), f(xw), f(z), m, n);
    expect_rounded(dx, dxw, mn, "row_gate dx");
    expect_rounded(dz, dzw, mm, "row_gate dz");
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
