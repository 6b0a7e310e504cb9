// model_flops_per_token (model/model_flops.h): 6 N for the active non-embedding parameters
// plus attention's causal (or windowed) pairs, by hand on small cases.
#include <gtest/gtest.h>

#include "peakbound/core/error.h"
#include "peakbound/model/model_flops.h"
#include "peakbound/model/param_count.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(ModelFlops, MeanVisibleKeysCountsTheCausalAndWindowedPairs) {
  EXPECT_DOUBLE_EQ(mean_visible_keys(4, 0), 2.5);         // 1 + 2 + 3 + 4 over 4
  EXPECT_DOUBLE_EQ(mean_visible_keys(4, 2), 7.0 / 4.0);   // 1 + 2 + 2 + 2
  EXPECT_DOUBLE_EQ(mean_visible_keys(4, 4), 2.5);         // a window as long as the sequence
  EXPECT_DOUBLE_EQ(mean_visible_keys(4, 9), 2.5);
  EXPECT_DOUBLE_EQ(mean_visible_keys(1, 0), 1.0);
  EXPECT_THROW(mean_visible_keys(0, 0), InvalidArgument);
}

// tiny-moe: every layer full causal attention; the dense term is 6 x the active
// non-embedding parameters (the head counts, the embedding does not).
TEST(ModelFlops, TinyMoeIsSixNPlusTheCausalAttentionTerm) {
  const ModelConfig c = preset_config("tiny-moe");
  const ParamCount n = count_params(c);
  const ModelFlops f = model_flops_per_token(c, 128);
  EXPECT_DOUBLE_EQ(f.dense, 6.0 * static_cast<double>(n.active_non_embedding));
  const double pair = 6.0 * static_cast<double>(c.num_heads * (c.head_dim + c.head_dim));
  EXPECT_DOUBLE_EQ(f.attention, static_cast<double>(c.num_layers) * pair * 64.5);
  EXPECT_DOUBLE_EQ(f.per_token(), f.dense + f.attention);
  EXPECT_GT(f.dense, 6.0 * static_cast<double>(n.active_non_embedding - n.lm_head));  // the head counts
  // ... for the scored tokens: a step that scores half its tokens counts half the head.
  EXPECT_DOUBLE_EQ(f.head, 6.0 * static_cast<double>(n.lm_head));
  EXPECT_DOUBLE_EQ(f.per_token(1.0), f.per_token());
  EXPECT_DOUBLE_EQ(f.per_token(0.5), f.per_token() - f.head / 2);
  EXPECT_DOUBLE_EQ(f.per_token(0.0), f.dense - f.head + f.attention);
}

// gpt-oss-120b: the sliding layers (window 128) see at most 128 keys; DeepSeek-V3's MLA
// pairs cost Hq (qk 192 + v 128).
TEST(ModelFlops, WindowsAndMlaWidths) {
  const ModelConfig g = preset_config("gpt-oss-120b");
  const std::int64_t S = 4096;
  const ModelFlops fg = model_flops_per_token(g, S);
  const double pair = 6.0 * static_cast<double>(g.num_heads * 2 * g.head_dim);
  const double sliding = static_cast<double>(g.num_sliding_layers), full = static_cast<double>(g.num_layers) - sliding;
  EXPECT_GT(sliding, 0);
  EXPECT_DOUBLE_EQ(fg.attention, pair * (sliding * mean_visible_keys(S, 128) + full * (S + 1) / 2.0));
  const ModelConfig d = preset_config("deepseek-v3");
  const ModelFlops fd = model_flops_per_token(d, S);
  EXPECT_DOUBLE_EQ(fd.attention, 61.0 * 6.0 * 128 * (192 + 128) * (S + 1) / 2.0);
  // 6 x 36.6B active non-embedding parameters (DeepSeek publishes 37B): 2.20e11 FLOP a token.
  EXPECT_NEAR(fd.dense / 1e11, 2.20, 0.01);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
