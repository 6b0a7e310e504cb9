// The embedding kernel over a vocabulary shard: rows outside the shard give zeros,
// the backward adds each token's gradient into its row (repeated ids summed). The bf16
// forms through the op layer: forward (bf16 table and out) bitwise the f32 form's output
// rounded; backward (bf16 dout into an fp32 dtable) bitwise the f32 form's sums.
#include "peakbound/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/embedding.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::widened;

TEST(Embedding, ForwardGathersShardRowsAndZeroesOthers) {
  const std::int64_t V = 7, H = 3, offset = 2, rows = 3;  // the shard holds ids 2, 3, 4
  std::vector<float> table(rows * H);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i + 1);
  const std::vector<std::int32_t> ids = {0, 2, 4, 3, 6, 2};
  std::vector<float> out(ids.size() * H, -1.0f);
  embedding_forward(out.data(), ids.data(), table.data(), static_cast<std::int64_t>(ids.size()), H, offset, rows);
  for (std::size_t t = 0; t < ids.size(); ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t r = ids[t] - offset;
      const float want = (r >= 0 && r < rows) ? table[r * H + h] : 0.0f;
      EXPECT_EQ(out[t * H + h], want) << "t=" << t << " h=" << h;
    }
  (void)V;
}

TEST(Embedding, BackwardAddsIntoRowsOfTheShard) {
  const std::int64_t H = 2, offset = 1, rows = 2;  // ids 1, 2
  const std::vector<std::int32_t> ids = {1, 0, 1, 2, 3};
  std::vector<float> dout(ids.size() * H);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(i);
  std::vector<float> dtable(rows * H, 10.0f);
  embedding_backward(dtable.data(), ids.data(), dout.data(), static_cast<std::int64_t>(ids.size()), H, offset, rows);
  // Row 0 (id 1): tokens 0 and 2; row 1 (id 2): token 3; ids 0 and 3 are not in the shard.
  EXPECT_EQ(dtable[0], 10.0f + 0 + 4);
  EXPECT_EQ(dtable[1], 10.0f + 1 + 5);
  EXPECT_EQ(dtable[2], 10.0f + 6);
  EXPECT_EQ(dtable[3], 10.0f + 7);
}

std::vector<bf16> random_bf16(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<bf16> v(n);
  for (bf16& x : v) x = peakbound::to_bf16(3.0f * nd(rng));
  return v;
}

struct Bf16Case {
  std::int64_t T, H, offset, rows;
};

// ids with repeats, some below and some above the shard [offset, offset + rows).
std::vector<std::int32_t> shard_ids(const Bf16Case& c) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(c.T));
  for (std::int64_t t = 0; t < c.T; ++t)
    ids[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7 + 3) % (c.offset + c.rows + 3));
  return ids;
}

TEST(Embedding, Bf16FormsAreTheF32FormsOnWidenedValues) {
  CpuDevice dev(1 << 20);
  Stream& s = dev.compute_stream();
  std::mt19937 rng(11);
  for (const Bf16Case c : {Bf16Case{37, 37, 2, 5}, Bf16Case{1, 17, 0, 3}, Bf16Case{1, 17, 4, 3}, Bf16Case{0, 9, 0, 4},
                           Bf16Case{64, 130, 3, 4}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " offset=" + std::to_string(c.offset));
    const std::vector<std::int32_t> ids = shard_ids(c);
    const auto TH = static_cast<std::size_t>(c.T * c.H), RH = static_cast<std::size_t>(c.rows * c.H);
    const std::vector<bf16> table = random_bf16(RH, rng), dout = random_bf16(TH, rng);
    // Forward: out prefilled with garbage, every element written.
    std::vector<bf16> out(TH, peakbound::to_bf16(-7.0f));
    std::vector<float> out_f(TH, -7.0f);
    const std::vector<float> table_f = widened(table);
    ops::embedding_forward(dev, s, out.data(), ids.data(), table.data(), c.T, c.H, c.offset, c.rows);
    ops::embedding_forward(dev, s, out_f.data(), ids.data(), table_f.data(), c.T, c.H, c.offset, c.rows);
    for (std::size_t i = 0; i < TH; ++i) ASSERT_EQ(out[i].bits, peakbound::to_bf16(out_f[i]).bits) << "out " << i;
    // Backward: added into a nonzero fp32 dtable; repeated ids sum in token order.
    std::vector<float> dtable(RH), dtable_f(RH);
    for (std::size_t i = 0; i < RH; ++i) dtable[i] = dtable_f[i] = 0.1f * static_cast<float>(i % 13) - 0.5f;
    const std::vector<float> dout_f = widened(dout);
    ops::embedding_backward(dev, s, dtable.data(), ids.data(), dout.data(), c.T, c.H, c.offset, c.rows);
    ops::embedding_backward(dev, s, dtable_f.data(), ids.data(), dout_f.data(), c.T, c.H, c.offset, c.rows);
    for (std::size_t i = 0; i < RH; ++i) {
      std::uint32_t a, b;
      std::memcpy(&a, &dtable[i], sizeof a);
      std::memcpy(&b, &dtable_f[i], sizeof b);
      ASSERT_EQ(a, b) << "dtable " << i << ": " << dtable[i] << " vs " << dtable_f[i];
    }
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
