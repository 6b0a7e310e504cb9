// A config.json setting that changes what the model computes, and that the trainer does
// not implement, is recorded by the importer (ModelConfig::unmodelled) and refused by
// check_trainable in one line naming the field, its value and what is implemented; a value
// equal to the implemented behaviour (or null) is accepted. Planning still takes the model.
#include <gtest/gtest.h>

#include <fstream>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/moe_transformer.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using nlohmann::json;

json fixture(const char* family) {
  std::ifstream f(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/" + family + "/config.json");
  return json::parse(f);
}

// check_trainable's error on the config, or "" when it trains.
std::string refusal(const json& j) {
  const ModelConfig c = parse_hf_config(j, "m");
  try {
    check_trainable(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

TEST(HfUnmodelled, FixturesTrainAsTheyAre) {
  for (const char* family : {"qwen3_moe", "mixtral"}) {
    EXPECT_EQ(refusal(fixture(family)), "") << family;
    EXPECT_TRUE(parse_hf_config(fixture(family), "m").unmodelled.empty()) << family;
  }
}

TEST(HfUnmodelled, ActivationOtherThanSiluIsRefused) {
  for (const char* family : {"qwen3_moe", "mixtral"})
    for (const char* act : {"gelu", "relu", "gelu_pytorch_tanh"}) {
      json j = fixture(family);
      j["hidden_act"] = act;
      const std::string e = refusal(j);
      EXPECT_HAS(e, std::string("hidden_act = \"") + act + "\"");
      EXPECT_HAS(e, "SiLU (\"silu\") only");
      EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    }
  json j = fixture("qwen3_moe");
  j["hidden_act"] = "swish";  // transformers' other name for SiLU
  EXPECT_EQ(refusal(j), "");
  j["hidden_act"] = nullptr;
  EXPECT_EQ(refusal(j), "");
}

TEST(HfUnmodelled, RopeScalingOtherThanYarnIsRefused) {
  json yarn = fixture("qwen3_moe");
  yarn["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
                             {"rope_theta", 10000.0}};
  EXPECT_EQ(refusal(yarn), "");  // YaRN is modelled (model/rope_scaling.h)
  // One RoPE for every layer: a YaRN object per attention type is not read.
  yarn["rope_parameters"] = {{"full_attention", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
  EXPECT_HAS(refusal(yarn), "rope_parameters.full_attention.rope_type = \"yarn\"");

  json linear = fixture("mixtral");
  linear.erase("rope_parameters");
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_HAS(refusal(linear), "rope_scaling.type = \"linear\"");
  EXPECT_HAS(refusal(linear), "the unscaled RoPE and YaRN");
  linear["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_HAS(refusal(linear), "rope_scaling.rope_type = \"dynamic\"");
  linear["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(refusal(linear), "");
  linear["rope_scaling"] = nullptr;
  EXPECT_EQ(refusal(linear), "");

  json partial = fixture("qwen3_moe");
  partial["partial_rotary_factor"] = 0.5;
  EXPECT_HAS(refusal(partial), "partial_rotary_factor = 0.5");
  partial["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(refusal(partial), "");
}

TEST(HfUnmodelled, TrainingNoiseAndScalesAreRefused) {
  json j = fixture("mixtral");
  j["router_jitter_noise"] = 0.01;
  EXPECT_HAS(refusal(j), "router_jitter_noise = 0.01");
  j = fixture("qwen3_moe");
  j["attention_dropout"] = 0.1;
  EXPECT_HAS(refusal(j), "attention_dropout = 0.1");
  j = fixture("qwen3_moe");
  j["final_logit_softcapping"] = 30.0;
  EXPECT_HAS(refusal(j), "final_logit_softcapping = 30.0");
  j = fixture("qwen3_moe");
  j["routed_scaling_factor"] = 1.0;  // the implemented value
  EXPECT_EQ(refusal(j), "");
}

// The other Qwen3-MoE / Mixtral fields that change the model either are implemented or
// were already refused by check_trainable; each value here changes the model.
TEST(HfUnmodelled, OtherModelChangingFieldsAreReadOrRefused) {
  json j = fixture("qwen3_moe");
  j["attention_bias"] = true;  // q, k, v and o_proj biases: implemented
  EXPECT_TRUE(parse_hf_config(j, "m").attention_qkv_bias);
  EXPECT_TRUE(parse_hf_config(j, "m").attention_out_bias);
  EXPECT_EQ(refusal(j), "");
  j = fixture("qwen3_moe");
  j["use_sliding_window"] = true;  // Qwen3-MoE (transformers 5.24) slides every layer
  j["sliding_window"] = 16;
  EXPECT_EQ(parse_hf_config(j, "m").sliding_layers, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(refusal(j), "");
  j.erase("use_sliding_window");  // absent: false, as transformers' Qwen configs default it
  EXPECT_EQ(parse_hf_config(j, "m").num_sliding_layers, 0);
  EXPECT_EQ(refusal(j), "");
  j = fixture("mixtral");
  j["sliding_window"] = 16;  // Mixtral slides whenever sliding_window is set
  EXPECT_EQ(parse_hf_config(j, "m").attention_window(1), 16);
  EXPECT_EQ(refusal(j), "");
  j = fixture("qwen3_moe");
  j["tie_word_embeddings"] = true;
  EXPECT_HAS(refusal(j), "tied embeddings");
  // Implemented: read into the config the trainer builds.
  j = fixture("qwen3_moe");
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 1;
  j["norm_topk_prob"] = false;
  j["head_dim"] = 16;
  const ModelConfig c = parse_hf_config(j, "m");
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(refusal(j), "");
}

// Planning a released checkpoint still works: what the trainer does not model is recorded,
// not fatal.
TEST(HfUnmodelled, ImportStillTakesScaledModels) {
  json j = fixture("qwen3_moe");
  j["hidden_act"] = "gelu";
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const ModelConfig c = parse_hf_config(j, "m");
  ASSERT_EQ(c.unmodelled.size(), 2u);
  EXPECT_HAS(c.unmodelled[0], "hidden_act");
  EXPECT_HAS(c.unmodelled[1], "rope_scaling.type");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

#undef EXPECT_HAS
