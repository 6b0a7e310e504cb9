// The JSON and one-line views of a model used by the CLI.
#include "peakbound/model/describe.h"

#include <gtest/gtest.h>

#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(Describe, JsonCarriesEveryShapeField) {
  const nlohmann::json j = to_json(preset_config("deepseek-v3"));
  EXPECT_EQ(j.at("hidden_size"), 7168);
  EXPECT_EQ(j.at("attention"), "mla");
  EXPECT_EQ(j.at("router_scoring"), "sigmoid");
  EXPECT_EQ(j.at("num_moe_layers"), 58);
  EXPECT_EQ(j.at("kv_lora_rank"), 512);
  const nlohmann::json p = to_json(count_params(preset_config("deepseek-v3")));
  EXPECT_EQ(p.at("total"), 671026419200);
  EXPECT_EQ(p.at("num_moe_layers"), 58);
}

TEST(Describe, SummaryLine) {
  const std::string s = summary(preset_config("deepseek-v3"));
  EXPECT_HAS(s, "deepseek-v3 (deepseek_v3)");
  EXPECT_HAS(s, "3 dense, 58 MoE");
  EXPECT_HAS(s, "256 experts top-8 + 1 shared");
  EXPECT_HAS(s, "671.03B params");
  EXPECT_HAS(s, "37.55B active");
  EXPECT_HAS(s, "+11.61B MTP");
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_HAS(summary(preset_config("tiny-moe")), "GQA 8/2 heads x 32");
}

TEST(Describe, FormatParams) {
  EXPECT_EQ(format_params(512), "512");
  EXPECT_EQ(format_params(19276032), "19.28M");
  EXPECT_EQ(format_params(671026419200), "671.03B");
  EXPECT_EQ(format_params(2'500'000'000'000), "2.50T");
  EXPECT_EQ(format_params(1500), "1.50K");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

#undef EXPECT_HAS
