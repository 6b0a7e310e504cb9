// DeepSeek-V3's multi-head latent attention (AttentionLayer with mla) against transformers'
// own DeepseekV3Attention behind its input_layernorm and residual
// (tests/fixtures/hf/deepseek_v3_parts, layer.<case>, written by
// scripts/hf_reference/make_deepseek_fixture.py): y, dx and every parameter's gradient, 3
// heads, qk = 6 nope + 4 rope, v 5, kv_lora_rank 10, 29 tokens. Cases: `lora` (q_lora_rank
// 12, interleaved RoPE) and `plain_yarn` (q_proj, rotate_half RoPE, biases on
// kv_a_proj_with_mqa and o_proj, YaRN with mscale != mscale_all_dim: cos and sin scaled by
// their ratio and the softmax by mscale_all_dim's squared). f32 to 1e-5 of max|ref|; bf16 to
// 2e-2 for y and dx and cosine >= 0.999 for each gradient; the measured peaks equal the
// footprint (attention_test::run_layer). The comparison can fail: the lora case without its
// interleave is far off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/io/safetensors.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/model/presets.h"
#include "peakbound/model/rope_scaling.h"
#include "peakbound/train/moe_transformer.h"
#include "tests/layers/attention_layer_harness.h"
#include "tests/layers/layer_checks.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using attention_test::Result;
using attention_test::Vec;
using layer_test::cosine;
using layer_test::max_relative;

const std::string kDir = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/deepseek_v3_parts/";

const SafeTensorsFile& fixture() {
  static const SafeTensorsFile f = SafeTensorsFile::open(kDir + "deepseek_v3_parts.safetensors");
  return f;
}

const nlohmann::json& reference() {
  static const nlohmann::json j = nlohmann::json::parse(std::ifstream(kDir + "reference.json"));
  return j;
}

// The fixture's case as a layer config (the softmax scale and YaRN's cos / sin factor as
// transformers computed them, from reference.json).
AttentionLayerConfig mla_config(const std::string& c, Precision p) {
  const nlohmann::json& a = reference()["attention"];
  const nlohmann::json& k = reference()["attention_cases"][c];
  AttentionLayerConfig cfg;
  cfg.hidden = a["H"];
  cfg.q_heads = cfg.kv_heads = a["heads"];
  cfg.mla = true;
  cfg.q_lora_rank = k["q_lora_rank"].is_null() ? 0 : k["q_lora_rank"].get<std::int64_t>();
  cfg.kv_lora_rank = a["kv_lora_rank"];
  cfg.qk_nope_dim = a["qk_nope_head_dim"];
  cfg.qk_rope_dim = a["qk_rope_head_dim"];
  cfg.v_dim = a["v_head_dim"];
  cfg.rope_interleave = k["rope_interleave"];
  cfg.qkv_bias = cfg.out_bias = k["attention_bias"];
  const nlohmann::json& r = k["rope_parameters"];
  cfg.rope_theta = r["rope_theta"];
  if (r["rope_type"] == "yarn") {
    cfg.rope_scaling.yarn = true;
    cfg.rope_scaling.factor = r["factor"];
    cfg.rope_scaling.original_max_position = r["original_max_position_embeddings"];
    cfg.rope_scaling.beta_fast = r["beta_fast"];
    cfg.rope_scaling.beta_slow = r["beta_slow"];
    cfg.rope_scaling.attention_factor = reference()["attention_scales"][c]["rope_attention_scaling"];
  }
  cfg.softmax_scale = static_cast<float>(reference()["attention_scales"][c]["softmax_scale"].get<double>());
  cfg.rms_eps = 1e-6f;
  cfg.precision = p;
  return cfg;
}

std::vector<std::string> names(const AttentionLayerConfig& c) {
  std::vector<std::string> n = {"input_layernorm.weight"};
  if (c.q_lora_rank > 0) {
    n.push_back("self_attn.q_a_proj.weight");
    if (c.qkv_bias) n.push_back("self_attn.q_a_proj.bias");
    n.push_back("self_attn.q_a_layernorm.weight");
    n.push_back("self_attn.q_b_proj.weight");
  } else {
    n.push_back("self_attn.q_proj.weight");
  }
  n.push_back("self_attn.kv_a_proj_with_mqa.weight");
  if (c.qkv_bias) n.push_back("self_attn.kv_a_proj_with_mqa.bias");
  n.push_back("self_attn.kv_a_layernorm.weight");
  n.push_back("self_attn.kv_b_proj.weight");
  n.push_back("self_attn.o_proj.weight");
  if (c.out_bias) n.push_back("self_attn.o_proj.bias");
  return n;
}

struct Errors {
  double y = 0, dx = 0, grad = 0, grad_cos = 1;
};

Errors compare(const std::string& c, const AttentionLayerConfig& cfg, bool expect) {
  const SafeTensorsFile& f = fixture();
  const std::string at = "layer." + c + ".";
  const std::vector<std::string> n = names(cfg);
  std::vector<Vec> params;
  for (const std::string& name : n) params.push_back(f.read_f32(at + name));
  const Result r = attention_test::run_layer(cfg, params, f.read_f32(at + "x"), f.read_f32(at + "dy"));
  Errors e;
  e.y = max_relative(r.y, f.read_f32(at + "y"));
  e.dx = max_relative(r.dx, f.read_f32(at + "dx"));
  EXPECT_EQ(r.grads.size(), n.size());
  for (std::size_t i = 0; i < n.size() && i < r.grads.size(); ++i) {
    const Vec want = f.read_f32(at + "grad." + n[i]);
    const double g = max_relative(r.grads[i], want), cs = cosine(r.grads[i], want);
    if (expect && cfg.precision == Precision::f32) {
      EXPECT_LE(g, 1e-5) << c << " grad " << n[i];
    }
    if (expect && cfg.precision == Precision::bf16) {
      EXPECT_GE(cs, 0.999) << c << " grad " << n[i];
    }
    e.grad = std::max(e.grad, g);
    e.grad_cos = std::min(e.grad_cos, cs);
  }
  return e;
}

// Both single-device forms: K and V of the whole sequence (piece_tokens past the 29
// tokens, or the kv form asked for), and the latent form, whose keys are expanded from the
// latent a piece at a time (pieces of 8 and of 5 tokens: 4 and 6 key pieces of unequal
// length; ring_attention_latent_* on one rank).
TEST(AttentionLayerMla, MatchesTransformersInBothPrecisions) {
  struct Form {
    std::int64_t piece_tokens;
    bool latent;
  };
  for (const char* c : {"lora", "plain_yarn"}) {
    for (Precision p : {Precision::f32, Precision::bf16}) {
      for (Form form : {Form{kRingPieceTokens, true}, Form{8, false}, Form{8, true}, Form{5, true}}) {
        const char* name = form.latent && form.piece_tokens < 29 ? "latent" : "kv";
        SCOPED_TRACE(std::string(c) + " " + std::string(precision_name(p)) + " " + name + " piece_tokens " +
                     std::to_string(form.piece_tokens));
        AttentionLayerConfig cfg = mla_config(c, p);
        cfg.piece_tokens = form.piece_tokens;
        cfg.mla_latent_ring = form.latent;
        const Errors e = compare(c, cfg, true);
        const double tol = p == Precision::f32 ? 1e-5 : 2e-2;
        EXPECT_LE(e.y, tol);
        EXPECT_LE(e.dx, tol);
        std::printf("MLA %s %s %s (pieces of %lld) vs transformers: y %.3g dx %.3g, worst gradient %.3g (cosine %.6f)\n",
                    c, std::string(precision_name(p)).c_str(), name, static_cast<long long>(form.piece_tokens), e.y,
                    e.dx, e.grad, e.grad_cos);
      }
    }
  }
}

// At cp 1 the latent form holds no K, V, kv or their gradients of the whole sequence: its
// footprint's largest phase falls below the K/V form's once the sequence spans pieces
// (DeepSeek-V3's shapes, 16384 tokens in pieces of 2048), and equals it within one piece.
TEST(AttentionLayerMla, TheLatentFormHoldsNoWholeKeysAtOneDevice) {
  AttentionLayerConfig c = model_attention_config(find_preset("deepseek-v3").config, 0, 1, 0, kRingPieceTokens);
  c.precision = Precision::bf16;
  const auto peak = [&](std::int64_t T, bool latent) {
    AttentionLayerConfig x = c;
    x.mla_latent_ring = latent;
    return attention_layer_footprint(T, x).device_peak(Component::attention);
  };
  EXPECT_EQ(peak(kRingPieceTokens, true), peak(kRingPieceTokens, false));
  const std::uint64_t lat = peak(16384, true), kv = peak(16384, false);
  EXPECT_LT(lat, kv);
  std::printf("DeepSeek-V3 attention at 16384 tokens, one device, bf16: latent form %.1f KiB a token, K/V form %.1f\n",
              static_cast<double>(lat) / 16384 / 1024, static_cast<double>(kv) / 16384 / 1024);
}

TEST(AttentionLayerMla, IgnoringTheInterleaveFailsTheComparison) {
  AttentionLayerConfig cfg = mla_config("lora", Precision::f32);
  cfg.rope_interleave = false;
  EXPECT_GT(compare("lora", cfg, false).y, 1e-3);
}

TEST(AttentionLayerMla, RefusesWhatItDoesNotCompute) {
  AttentionLayerConfig cfg = mla_config("lora", Precision::f32);
  cfg.kv_heads = 1;
  EXPECT_THROW(check_attention_layer_config(cfg), InvalidArgument);
  cfg = mla_config("lora", Precision::f32);
  cfg.qk_rope_dim = 3;
  EXPECT_THROW(check_attention_layer_config(cfg), InvalidArgument);
  cfg = mla_config("lora", Precision::f32);
  cfg.sinks = true;
  EXPECT_THROW(check_attention_layer_config(cfg), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
