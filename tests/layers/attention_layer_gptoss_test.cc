// gpt-oss's attention sublayer (AttentionLayer with qkv_bias, out_bias, sinks and a window)
// against transformers' own GptOssAttention behind its input_layernorm and residual, with the
// config's YaRN rotary embedding (tests/fixtures/hf/gpt_oss_parts, layer.<case>, written by
// scripts/hf_reference/make_gptoss_fixture.py): y, dx and every parameter's gradient, a full
// layer and a sliding one (window 5 of 29 tokens), H 24 != Hq D 32. f32 to 1e-5 of max|ref|
// (only the order of fp32 sums differs); bf16 (parameters and activations narrowed from the
// same values) to 2e-2 of max|ref| for y and dx and cosine >= 0.999 for each gradient. Also:
// the layer ignoring the window or the sinks fails the comparison, and the measured peaks
// equal the footprint (attention_test::run_layer checks them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "peakbound/io/safetensors.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/model/rope_scaling.h"
#include "tests/layers/attention_layer_harness.h"
#include "tests/layers/layer_checks.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using attention_test::Result;
using attention_test::Vec;
using layer_test::cosine;
using layer_test::max_relative;

const SafeTensorsFile& fixture() {
  static const SafeTensorsFile f = SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) +
                                                         "/tests/fixtures/hf/gpt_oss_parts/gpt_oss_parts.safetensors");
  return f;
}

// The HF names (under model.layers.0) in AttentionLayer::parameters() order for gpt-oss.
const std::vector<std::string> kNames = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_proj.bias",  "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
    "self_attn.o_proj.bias",  "self_attn.sinks"};

// The fixture's layer: reference.json's LAYER and gpt-oss's default rope_parameters
// (YaRN factor 32 over 4096 positions, betas 32 / 1, no truncation, theta 150000).
AttentionLayerConfig gptoss_config(std::int64_t window, Precision p) {
  AttentionLayerConfig c = attention_test::config(24, 4, 2, 8, false, 0, p);
  c.rope_theta = 150000.0;
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.attention_factor = yarn_get_mscale(32.0);
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.original_max_position = 4096;
  c.rope_scaling.truncate = false;
  c.rms_eps = 1e-5f;  // GptOssConfig's rms_norm_eps
  c.qkv_bias = c.out_bias = c.sinks = true;
  c.window = window;
  return c;
}

struct Errors {
  double y = 0, dx = 0, grad = 0, grad_cos = 1;
};

// The layer of `cfg` on the fixture's case against transformers' values.
Errors compare(const std::string& c, const AttentionLayerConfig& cfg) {
  const SafeTensorsFile& f = fixture();
  const std::string at = "layer." + c + ".";
  std::vector<Vec> params;
  for (const std::string& n : kNames) params.push_back(f.read_f32(at + n));
  const Result r = attention_test::run_layer(cfg, params, f.read_f32(at + "x"), f.read_f32(at + "dy"));
  Errors e;
  e.y = max_relative(r.y, f.read_f32(at + "y"));
  e.dx = max_relative(r.dx, f.read_f32(at + "dx"));
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    const Vec want = f.read_f32(at + "grad." + kNames[i]);
    const double g = max_relative(r.grads[i], want), cs = cosine(r.grads[i], want);
    EXPECT_TRUE(std::isfinite(g)) << kNames[i];
    if (cfg.precision == Precision::f32) EXPECT_LE(g, 1e-5) << c << " grad " << kNames[i];
    else EXPECT_GE(cs, 0.999) << c << " grad " << kNames[i];
    e.grad = std::max(e.grad, g);
    e.grad_cos = std::min(e.grad_cos, cs);
  }
  return e;
}

TEST(AttentionLayerGptOss, MatchesTransformersFullAndSlidingInBothPrecisions) {
  for (auto [c, window] : {std::pair<const char*, std::int64_t>{"full", 0}, {"sliding", 5}}) {
    for (Precision p : {Precision::f32, Precision::bf16}) {
      SCOPED_TRACE(std::string(c) + " " + std::string(precision_name(p)));
      const Errors e = compare(c, gptoss_config(window, p));
      const double tol = p == Precision::f32 ? 1e-5 : 2e-2;
      EXPECT_LE(e.y, tol);
      EXPECT_LE(e.dx, tol);
      std::printf("gpt-oss attention %s %s vs transformers: y %.3g dx %.3g, worst gradient %.3g (cosine %.6f)\n", c,
                  std::string(precision_name(p)).c_str(), e.y, e.dx, e.grad, e.grad_cos);
    }
  }
}

// The comparison can fail: the sliding case without its window, or either case without the
// sinks (their logits held at -inf: a sink that takes no probability), is far off.
TEST(AttentionLayerGptOss, IgnoringTheWindowOrTheSinksFailsTheComparison) {
  const SafeTensorsFile& f = fixture();
  const Errors no_window = [&] {
    ::testing::ScopedTrace t(__FILE__, __LINE__, "expected failures below");
    AttentionLayerConfig cfg = gptoss_config(0, Precision::f32);
    std::vector<Vec> params;
    for (const std::string& n : kNames) params.push_back(f.read_f32("layer.sliding." + n));
    const Result r = attention_test::run_layer(cfg, params, f.read_f32("layer.sliding.x"),
                                               f.read_f32("layer.sliding.dy"));
    Errors e;
    e.y = max_relative(r.y, f.read_f32("layer.sliding.y"));
    return e;
  }();
  EXPECT_GT(no_window.y, 1e-2);
  std::vector<Vec> params;
  for (const std::string& n : kNames) params.push_back(f.read_f32("layer.full." + n));
  params.back().assign(params.back().size(), -1e30f);
  const Result r = attention_test::run_layer(gptoss_config(0, Precision::f32), params, f.read_f32("layer.full.x"),
                                             f.read_f32("layer.full.dy"));
  EXPECT_GT(max_relative(r.y, f.read_f32("layer.full.y")), 1e-2);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
