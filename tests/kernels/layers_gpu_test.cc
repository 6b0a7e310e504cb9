// The CUDA backend's rotary embedding, token embedding and row gate against the CPU
// backend on the same inputs through the same ops:: calls: odd sizes, ids outside the
// shard, repeated ids (the embedding gradient adds them in order), the gate written
// and added into. Skips without a GPU.
#include <cstring>

#include "peakbound/ops/embedding.h"
#include "peakbound/ops/rope.h"
#include "peakbound/ops/row_gate.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {

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

}  // namespace
}  // namespace peakbound
