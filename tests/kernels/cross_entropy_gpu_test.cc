// The CUDA backend's blockwise cross-entropy and vocabulary row statistics against the
// CPU backend: two vocabulary blocks folded with lse_update and merged with lse_merge,
// targets inside and outside each block and ignored, z-loss on, the finishing loss and
// count, the gradient in place, and the materialized path's row max / sum / lse.
// Skips without a GPU.
#include <cstring>

#include "peakbound/ops/cross_entropy.h"
#include "peakbound/ops/vocab_rows.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::f;
using testing::randn;
using testing::same_on_both;

TEST(CudaKernels, CrossEntropyBlocksMatchCpu) {
  PB_NEED_GPU();
  const std::int64_t rows = 37, cols = 301, ld = 310, half = 150;  // blocks [0, 150) and [150, 301)
  std::vector<float> targets(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = r % 9 == 0 ? -100 : static_cast<std::int32_t>((r * 37) % cols);
    std::memcpy(&targets[static_cast<std::size_t>(r)], &t, sizeof t);
  }
  const auto zr = static_cast<std::size_t>(rows);
  std::vector<float> neg_inf(zr, -INFINITY), zeros(zr, 0.0f);
  std::vector<double> loss(2);
  std::vector<std::int64_t> count(2);
  int which = 0;
  same_on_both({randn(static_cast<std::size_t>(rows * ld), 1), targets, neg_inf, zeros, zeros, neg_inf, zeros, zeros,
                zeros, zeros, neg_inf},
               [&](Device& dev, std::vector<Buffer>& b) {
                 Stream& s = dev.compute_stream();
                 const auto* t = static_cast<const std::int32_t*>(b[1].data());
                 // Block 1 into (max a, sum a, target a); block 2 into (max b, sum b, target b); merge.
                 ops::lse_update(dev, s, f(b[0]), rows, half, ld, f(b[2]), f(b[3]));
                 ops::gather_target_logit(dev, s, f(b[0]), rows, half, ld, t, 0, f(b[4]));
                 ops::lse_update(dev, s, f(b[0]) + half, rows, cols - half, ld, f(b[5]), f(b[6]));
                 ops::gather_target_logit(dev, s, f(b[0]) + half, rows, cols - half, ld, t, half, f(b[7]));
                 ops::lse_merge(dev, s, f(b[2]), f(b[3]), f(b[4]), f(b[5]), f(b[6]), f(b[7]), rows);
                 loss[static_cast<std::size_t>(which)] = ops::cross_entropy_finish(
                     dev, s, f(b[2]), f(b[3]), f(b[4]), t, rows, -100, 1e-4f, f(b[8]), &count[static_cast<std::size_t>(which)]);
                 ops::cross_entropy_grad(dev, s, f(b[0]), rows, cols, ld, f(b[8]), t, 0, -100, 1e-4f, 0.5f);
                 // The materialized path's statistics of the gradient block (any block will do).
                 ops::vocab_row_max(dev, s, f(b[0]), rows, cols, ld, f(b[10]));
                 ops::vocab_row_sum_exp(dev, s, f(b[0]), rows, cols, ld, f(b[10]), f(b[9]));
                 ops::vocab_lse_finalize(dev, s, f(b[10]), f(b[9]), rows);
                 ++which;
               }, 2e-5f, "cross-entropy");
  EXPECT_EQ(count[0], count[1]);
  EXPECT_EQ(count[0], rows - 5);  // rows 0, 9, 18, 27, 36 are ignored
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0]));
}

TEST(CudaKernels, FusedCrossEntropyGradMatchesCpu) {
  PB_NEED_GPU();
  // 300 rows: two launches of the CUDA op's row chunks; targets ignored every 7th row.
  const std::int64_t rows = 300, cols = 1001, ld = 1003;
  std::vector<float> targets(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t t = r % 7 == 3 ? -100 : static_cast<std::int32_t>((r * 131) % cols);
    std::memcpy(&targets[static_cast<std::size_t>(r)], &t, sizeof t);
  }
  std::vector<double> loss(2);
  std::vector<std::int64_t> count(2);
  int which = 0;
  same_on_both({randn(static_cast<std::size_t>(rows * ld), 1), targets}, [&](Device& dev, std::vector<Buffer>& b) {
    const auto i = static_cast<std::size_t>(which++);
    loss[i] = ops::cross_entropy_fused_grad(dev, dev.compute_stream(), f(b[0]), rows, cols, ld,
                                            static_cast<const std::int32_t*>(b[1].data()), -100, 1e-4f, 0.25f, &count[i]);
  }, 2e-5f, "fused cross-entropy");
  EXPECT_EQ(count[1], count[0]);
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0]));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
