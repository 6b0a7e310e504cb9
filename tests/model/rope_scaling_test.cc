// YaRN (model/rope_scaling.h, read by model/hf_config.cc) against transformers' own
// _compute_yarn_parameters (tests/fixtures/hf/rope_yarn, written by
// scripts/hf_reference/make_rope_fixture.py): each case's config.json parsed as a user's
// would be, its inverse frequencies to 1e-6 (transformers computes them in float32) and its
// cos/sin factor to 1e-12; every form of the factor (given, mscale over mscale_all_dim,
// from the factor alone, from max_position_embeddings when the factor is null), truncate
// off, the legacy rope_scaling spelling; the CPU tables carry the factor; malformed YaRN
// settings are one-line errors naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/rope.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/rope_scaling.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using nlohmann::json;

json reference() {
  std::ifstream in(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/rope_yarn/reference.json");
  return json::parse(in);
}

std::string error_of(const json& j) {
  try {
    parse_hf_config(j, "x");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(RopeYarn, FrequenciesAndFactorAreTransformers) {
  const json ref = reference();
  ASSERT_GE(ref.at("cases").size(), 7u);
  for (const auto& [name, c] : ref.at("cases").items()) {
    SCOPED_TRACE(name);
    const ModelConfig m = parse_hf_config(c.at("config"), name);
    ASSERT_TRUE(m.rope_scaling.yarn);
    EXPECT_NEAR(m.rope_scaling.attention_factor, c.at("attention_factor").get<double>(), 1e-12);
    const std::int64_t d = c.at("dim");
    const std::vector<double> want = c.at("inv_freq");
    ASSERT_EQ(static_cast<std::int64_t>(want.size()), d / 2);
    double worst = 0;
    for (std::int64_t i = 0; i < d / 2; ++i)
      worst = std::max(worst, std::fabs(rope_inv_freq(m.rope_theta, m.rope_scaling, i, d) - want[i]) / want[i]);
    EXPECT_LT(worst, 1e-6);
    // The plain frequencies differ (YaRN changes something in every case).
    double plain_worst = 0;
    for (std::int64_t i = 0; i < d / 2; ++i)
      plain_worst = std::max(plain_worst, std::fabs(rope_inv_freq(m.rope_theta, RopeScaling{}, i, d) - want[i]) / want[i]);
    EXPECT_GT(plain_worst, 1e-2);
  }
  EXPECT_FALSE(parse_hf_config(ref["cases"]["gpt_oss"]["config"], "g").rope_scaling.truncate);
}

TEST(RopeYarn, TheTablesCarryTheAttentionFactor) {
  RopeScaling y;
  y.yarn = true;
  y.factor = 4.0;
  y.original_max_position = 8;
  y.attention_factor = 1.25;
  const std::int64_t T = 5, d = 8, half = d / 2;
  std::vector<float> c(T * half), s(T * half), c0(T * half), s0(T * half);
  cpu::rope_tables(c.data(), s.data(), T, d, 3, 10000.0, y);
  RopeScaling unscaled = y;
  unscaled.attention_factor = 1.0;
  cpu::rope_tables(c0.data(), s0.data(), T, d, 3, 10000.0, unscaled);
  for (std::int64_t e = 0; e < T * half; ++e) {
    const std::int64_t p = e / half + 3, i = e % half;
    const double angle = static_cast<double>(p) * rope_inv_freq(10000.0, y, i, d);
    EXPECT_EQ(c[e], static_cast<float>(std::cos(angle) * 1.25));
    EXPECT_EQ(s[e], static_cast<float>(std::sin(angle) * 1.25));
    EXPECT_EQ(c0[e], static_cast<float>(std::cos(angle)));
  }
}

TEST(RopeYarn, MalformedSettingsAreOneLineErrors) {
  json j = reference()["cases"]["qwen3_moe"]["config"];
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_NE(error_of(j).find("rope_parameters: yarn needs original_max_position_embeddings"), std::string::npos)
      << error_of(j);
  j = reference()["cases"]["qwen3_moe"]["config"];
  j["rope_parameters"]["factor"] = 0.5;
  EXPECT_NE(error_of(j).find("factor must be a finite number >= 1, got 0.5"), std::string::npos) << error_of(j);
  j["rope_parameters"]["factor"] = "big";
  EXPECT_NE(error_of(j).find("rope_parameters.factor must be a number"), std::string::npos) << error_of(j);
  j = reference()["cases"]["gpt_oss"]["config"];
  j["rope_parameters"]["truncate"] = "no";
  EXPECT_NE(error_of(j).find("rope_parameters.truncate must be true or false"), std::string::npos) << error_of(j);
  j = reference()["cases"]["no_factor"]["config"];
  j.erase("max_position_embeddings");
  EXPECT_NE(error_of(j).find("without a factor needs max_position_embeddings"), std::string::npos) << error_of(j);
  for (const json& bad : {json(reference()["cases"]["qwen3_moe"]["config"])}) EXPECT_EQ(error_of(bad), "");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
