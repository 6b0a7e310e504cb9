// rope_theta in ModelConfig: read from config.json at the top level (transformers
// 4.x) or under rope_parameters (5.x), the family default when absent, validated.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using nlohmann::json;

json llama() {
  return json{{"model_type", "llama"}, {"vocab_size", 32}, {"hidden_size", 8},
              {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"intermediate_size", 16}};
}

std::string error_of(const json& j) {
  try {
    parse_hf_config(j, "x");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(RopeTheta, TopLevelAndRopeParameters) {
  json j = llama();
  EXPECT_EQ(parse_hf_config(j, "x").rope_theta, 10000.0);  // llama's default
  j["rope_theta"] = 500000.0;
  EXPECT_EQ(parse_hf_config(j, "x").rope_theta, 500000.0);
  j.erase("rope_theta");
  j["rope_parameters"] = json{{"rope_type", "default"}, {"rope_theta", 1000000}};
  EXPECT_EQ(parse_hf_config(j, "x").rope_theta, 1e6);
  j["rope_theta"] = nullptr;  // null counts as absent
  EXPECT_EQ(parse_hf_config(j, "x").rope_theta, 1e6);
}

TEST(RopeTheta, FamilyDefaultsAndPresets) {
  json j = llama();
  j["model_type"] = "mixtral";
  j["num_local_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  EXPECT_EQ(parse_hf_config(j, "x").rope_theta, 1e6);  // MixtralConfig's default
  EXPECT_EQ(preset_config("qwen3-30b-a3b").rope_theta, 1e6);
  EXPECT_EQ(preset_config("mixtral-8x22b").rope_theta, 1e6);
  EXPECT_EQ(preset_config("deepseek-v3").rope_theta, 10000.0);
  EXPECT_EQ(preset_config("gpt-oss-120b").rope_theta, 150000.0);
}

TEST(RopeTheta, BadValuesAreNamed) {
  json j = llama();
  j["rope_theta"] = "big";
  EXPECT_NE(error_of(j).find("field 'rope_theta' must be a number"), std::string::npos) << error_of(j);
  j.erase("rope_theta");
  j["rope_parameters"] = json{{"rope_theta", true}};
  EXPECT_NE(error_of(j).find("'rope_parameters.rope_theta'"), std::string::npos) << error_of(j);
  j["rope_parameters"] = json{{"rope_theta", 0}};
  EXPECT_NE(error_of(j).find("rope_theta must be a finite number > 0"), std::string::npos) << error_of(j);

  ModelConfig c = preset_config("tiny-moe");
  c.rope_theta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(c.validate(), InvalidArgument);
  c.rope_theta = std::numeric_limits<double>::infinity();
  EXPECT_THROW(c.validate(), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
