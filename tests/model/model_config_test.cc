// ModelConfig layout rules and validation messages.
#include "peakbound/model/model_config.h"

#include <functional>

#include <gtest/gtest.h>

#include "peakbound/core/error.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The message validate() throws after `edit` is applied to tiny-moe.
std::string invalid(const std::function<void(ModelConfig&)>& edit) {
  ModelConfig c = preset_config("tiny-moe");
  edit(c);
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "config was accepted";
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(ModelConfig, LayerPlacement) {
  const ModelConfig c = preset_config("deepseek-v3");
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
  EXPECT_EQ(c.num_moe_layers(), 58);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.value_head_dim(), 128);
  EXPECT_EQ(c.shared_expert_width(), 2048);
}

TEST(ModelConfig, ValidationNamesTheProblem) {
  EXPECT_HAS(invalid([](ModelConfig& c) { c.hidden_size = 0; }), "hidden_size must be > 0, got 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.vocab_size = -5; }), "vocab_size must be > 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.top_k = 9; }), "top_k (9) exceeds num_experts (8)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.top_k = 0; }), "top_k must be > 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.num_kv_heads = 3; }),
             "num_kv_heads (3) does not divide num_heads (8)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.dense_intermediate_size = 0; }),
             "dense_intermediate_size must be > 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.num_dense_layers = 5; }),
             "num_dense_layers (5) exceeds num_layers (4)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.mlp_only_layers = {4}; }),
             "mlp_only_layers entry 4 is outside [0, 4)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.mlp_only_layers = {2, 1}; }),
             "mlp_only_layers must be increasing without repeats (1 after 2)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.mlp_only_layers = {1, 1}; }), "(1 after 1)");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.moe_intermediate_size = 0; }),
             "moe_intermediate_size must be > 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.num_experts = 0; }), "num_experts is 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.shared_expert_gate = true; }), "shared_expert_gate");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.hidden_size = std::int64_t{1} << 40; }),
             "implausibly large");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.num_layers = 1 << 20; }), "num_layers = 1048576");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.num_sliding_layers = 2; }), "sliding_window > 0");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.kv_lora_rank = 512; }), "attention is gqa");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.name.clear(); }), "empty name");
  EXPECT_HAS(invalid([](ModelConfig& c) { c.hidden_size = 0; }), "model 'tiny-moe': ");
}

TEST(ModelConfig, MlaValidation) {
  ModelConfig c = preset_config("deepseek-v3");
  c.head_dim = 128;
  EXPECT_THROW(c.validate(), InvalidArgument);
  c = preset_config("deepseek-v3");
  c.kv_lora_rank = 0;
  EXPECT_THROW(c.validate(), InvalidArgument);
  c = preset_config("deepseek-v3");
  c.num_kv_heads = 1;
  EXPECT_THROW(c.validate(), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

#undef EXPECT_HAS
