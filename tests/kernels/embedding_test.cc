// The embedding kernel over a vocabulary shard: rows outside the shard give zeros,
// the backward adds each token's gradient into its row (repeated ids summed).
#include "peakbound/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace peakbound::cpu {
namespace {

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

}  // namespace
}  // namespace peakbound::cpu
