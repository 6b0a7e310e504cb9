// Hugging Face config.json import: the released config.json of each family must
// import to exactly the matching preset, and every bad input must fail with a
// message naming the problem.
#include "peakbound/model/hf_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "peakbound/core/error.h"
#include "peakbound/model/param_count.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using nlohmann::json;

// deepseek-ai/DeepSeek-V3 config.json.
constexpr const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "pretraining_tp": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

// Qwen/Qwen3-30B-A3B config.json.
constexpr const char* kQwen3_30B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3-235B-A22B config.json.
constexpr const char* kQwen3_235B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 94,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 1536,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 94,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// mistralai/Mixtral-8x22B-v0.1 config.json.
constexpr const char* kMixtral8x22B = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 6144,
  "initializer_range": 0.02,
  "intermediate_size": 16384,
  "max_position_embeddings": 65536,
  "model_type": "mixtral",
  "num_attention_heads": 48,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 56,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "router_jitter_noise": 0.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// openai/gpt-oss-120b config.json.
constexpr const char* kGptOss120B = R"({
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": 200002,
  "experts_per_token": 4,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2880,
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": 64,
  "num_experts_per_tok": 4,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "num_local_experts": 128,
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"
  },
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": false
  },
  "rope_theta": 150000,
  "router_aux_loss_coef": 0.9,
  "sliding_window": 128,
  "swiglu_limit": 7.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": 201088
})";

// Qwen/Qwen1.5-MoE-A2.7B config.json: 14.3B total, 2.7B activated.
constexpr const char* kQwen15MoE = R"({
  "architectures": ["Qwen2MoeForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 8192,
  "max_window_layers": 21,
  "model_type": "qwen2_moe",
  "num_attention_heads": 16,
  "num_hidden_layers": 24,
  "num_key_value_heads": 16,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936,
  "decoder_sparse_step": 1,
  "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632,
  "num_experts_per_tok": 4,
  "num_experts": 60,
  "norm_topk_prob": false,
  "output_router_logits": false,
  "router_aux_loss_coef": 0.001
})";

// meta-llama/Llama-3.1-8B config.json (rope_scaling trimmed): 8.03B.
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
})";

// The message of the InvalidArgument `fn` throws; fails the test if none.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// A fresh folder per test, so parallel test runs do not collide.
class HfConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("peakbound_hf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& relative, const std::string& text) {
    const std::filesystem::path p = dir_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

  std::filesystem::path dir_;
};

// The imported config less what the trainer does not model (ModelConfig::unmodelled),
// which presets do not carry.
ModelConfig modelled(ModelConfig c) {
  c.unmodelled.clear();
  return c;
}

TEST(HfConfig, DeepSeekV3EqualsPreset) {
  const ModelConfig c = parse_hf_config(json::parse(kDeepSeekV3), "deepseek-v3");
  EXPECT_EQ(modelled(c), preset_config("deepseek-v3"));
  // YaRN is read (mscale = mscale_all_dim: cos and sin unscaled); the group-limited
  // routing and its scale are modelled (nothing unmodelled).
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position, 4096);
  EXPECT_EQ(c.rope_scaling.attention_factor, 1.0);
  EXPECT_TRUE(c.rope_scaling.truncate);
  EXPECT_TRUE(c.unmodelled.empty()) << c.unmodelled[0];
  EXPECT_EQ(c.attention, AttentionKind::mla);
  EXPECT_EQ(c.router_scoring, RouterScoring::sigmoid);
  EXPECT_TRUE(c.router_score_correction);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(count_params(c).total, 671026419200);
}

// moonshotai/Kimi-K2-Instruct's config.json: V3's file with the fields Kimi-K2 changes.
TEST(HfConfig, KimiK2EqualsPreset) {
  json d = json::parse(kDeepSeekV3);
  d["model_type"] = "kimi_k2";
  d["bos_token_id"] = 163584;
  d["eos_token_id"] = 163585;
  d["first_k_dense_replace"] = 1;
  d["max_position_embeddings"] = 131072;
  d["n_group"] = 1;
  d["n_routed_experts"] = 384;
  d["num_attention_heads"] = 64;
  d["num_key_value_heads"] = 64;
  d["num_nextn_predict_layers"] = 0;
  d["rope_scaling"] = json::parse(R"({"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"})");
  d["rope_theta"] = 50000.0;
  d["routed_scaling_factor"] = 2.827;
  d["topk_group"] = 1;
  d["vocab_size"] = 163840;
  const ModelConfig c = parse_hf_config(d, "kimi-k2");
  EXPECT_TRUE(c.unmodelled.empty()) << c.unmodelled[0];
  EXPECT_EQ(modelled(c), preset_config("kimi-k2"));
  EXPECT_EQ(c.rope_scaling.beta_fast, 1.0);
  EXPECT_EQ(c.num_experts, 384);
  EXPECT_EQ(count_params(c).total, 1026408232448);
}

// dots.llm1 (the tiny fixture's config.json as transformers 5.24 saved it): Qwen3's attention,
// DeepSeek-V3's router and shared experts, a dense first layer, the window from
// max_window_layers on; a routed scale with a softmax router stays unmodelled.
TEST(HfConfig, Dots1ReadsDeepSeekRoutingOverQwen3Attention) {
  const ModelConfig c = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/dots1");
  EXPECT_EQ(c.family, "dots1");
  EXPECT_TRUE(c.unmodelled.empty()) << c.unmodelled[0];
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.attention, AttentionKind::gqa);
  EXPECT_EQ(c.router_scoring, RouterScoring::sigmoid);
  EXPECT_TRUE(c.router_score_correction);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_TRUE(c.merged_shared_experts());
  EXPECT_EQ(c.num_dense_layers, 1);
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{2}));
  json q = json::parse(kQwen3_30B);
  q["routed_scaling_factor"] = 2.0;
  const ModelConfig s = parse_hf_config(q, "q");
  ASSERT_EQ(s.unmodelled.size(), 1u);
  EXPECT_EQ(s.unmodelled[0].rfind("routed_scaling_factor = 2", 0), 0u) << s.unmodelled[0];
}

TEST(HfConfig, Qwen3MoeEqualsPresets) {
  EXPECT_EQ(parse_hf_config(json::parse(kQwen3_30B), "qwen3-30b-a3b"),
            preset_config("qwen3-30b-a3b"));
  EXPECT_EQ(parse_hf_config(json::parse(kQwen3_235B), "qwen3-235b-a22b"),
            preset_config("qwen3-235b-a22b"));
}

TEST(HfConfig, MixtralEqualsPreset) {
  const ModelConfig c = parse_hf_config(json::parse(kMixtral8x22B), "mixtral-8x22b");
  EXPECT_EQ(c, preset_config("mixtral-8x22b"));
  EXPECT_EQ(c.moe_intermediate_size, 16384);  // intermediate_size is the expert width
  EXPECT_EQ(c.dense_intermediate_size, 0);
}

TEST(HfConfig, GptOssEqualsPreset) {
  const ModelConfig c = parse_hf_config(json::parse(kGptOss120B), "gpt-oss-120b");
  EXPECT_EQ(modelled(c), preset_config("gpt-oss-120b"));
  EXPECT_EQ(c.num_sliding_layers, 18);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_TRUE(c.attention_sinks);
}

TEST(HfConfig, GptOssWithoutLayerTypesAlternates) {
  json j = json::parse(kGptOss120B);
  j.erase("layer_types");
  j.erase("experts_per_token");  // num_experts_per_tok alone suffices
  EXPECT_EQ(modelled(parse_hf_config(j, "gpt-oss-120b")), preset_config("gpt-oss-120b"));
}

TEST(HfConfig, GptOssTopKNamesMustAgree) {
  json j = json::parse(kGptOss120B);
  j["num_experts_per_tok"] = 8;
  const std::string msg = error_of([&] { parse_hf_config(j, "x"); });
  EXPECT_HAS(msg, "'experts_per_token' (4)");
  EXPECT_HAS(msg, "'num_experts_per_tok' (8)");
  EXPECT_HAS(msg, "disagree");
}

TEST(HfConfig, LayerTypesMustCoverEveryLayer) {
  json j = json::parse(kGptOss120B);
  j["layer_types"].erase(j["layer_types"].size() - 1);
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "'layer_types' has 35 entries");
}

TEST(HfConfig, LayerTypesAreKnownNames) {
  json j = json::parse(kGptOss120B);
  j["layer_types"][3] = "chunked_attention";
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "'layer_types' has \"chunked_attention\"");
}

// Which layers slide, family by family, as transformers 5.24 builds their masks when the
// config lists no layer_types: gpt-oss from layer 0 every other; Qwen2-MoE the even layers
// below max_window_layers; Qwen3-MoE and Mixtral every layer; layer_types, when given, rule.
TEST(HfConfig, SlidingLayersFollowEachFamilysRule) {
  json j = json::parse(kGptOss120B);
  ModelConfig c = parse_hf_config(j, "x");
  EXPECT_EQ(c.attention_window(0), 128);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.attention_window(34), 128);
  EXPECT_EQ(c.sliding_layers.size(), 18u);
  j["layer_types"] = json::array();
  for (int i = 0; i < 36; ++i) j["layer_types"].push_back(i >= 30 ? "sliding_attention" : "full_attention");
  c = parse_hf_config(j, "x");
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{30, 31, 32, 33, 34, 35}));
  EXPECT_EQ(c.attention_window(29), 0);

  j = json::parse(kQwen15MoE);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  j["max_window_layers"] = 5;
  c = parse_hf_config(j, "x");
  EXPECT_EQ(c.sliding_layers, (std::vector<std::int64_t>{0, 2, 4}));
  j["use_sliding_window"] = false;
  EXPECT_EQ(parse_hf_config(j, "x").num_sliding_layers, 0);
}

TEST(HfConfig, SlidingLayersAreValidated) {
  ModelConfig c = preset_config("gpt-oss-120b");
  c.sliding_layers.push_back(40);
  c.num_sliding_layers = static_cast<std::int64_t>(c.sliding_layers.size());
  EXPECT_HAS(error_of([&] { c.validate(); }), "sliding_layers entry 40 is outside [0, 36)");
  c = preset_config("gpt-oss-120b");
  c.num_sliding_layers = 3;
  EXPECT_HAS(error_of([&] { c.validate(); }), "sliding_layers lists 18 layers but num_sliding_layers is 3");
  c = preset_config("gpt-oss-120b");
  std::swap(c.sliding_layers[0], c.sliding_layers[1]);
  EXPECT_HAS(error_of([&] { c.validate(); }), "sliding_layers must be increasing");
}

TEST(HfConfig, Qwen2MoeSharedExpertAndPublishedCounts) {
  const ModelConfig c = parse_hf_config(json::parse(kQwen15MoE), "qwen1.5-moe-a2.7b");
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.shared_expert_gate);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  const ParamCount p = count_params(c);
  EXPECT_NEAR(static_cast<double>(p.total), 14.3e9, 0.01 * 14.3e9);
  EXPECT_NEAR(static_cast<double>(p.active), 2.7e9, 0.01 * 2.7e9);
}

TEST(HfConfig, DenseLlama) {
  const ModelConfig c = parse_hf_config(json::parse(kLlama31_8B), "llama-3.1-8b");
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_EQ(c.num_moe_layers(), 0);
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads when head_dim is absent
  const ParamCount p = count_params(c);
  EXPECT_EQ(p.total, 8030261248);
  EXPECT_EQ(p.active, p.total);
}

TEST(HfConfig, DeepSeekMoeLayerFreqBecomesForcedDenseLayers) {
  json j = json::parse(kDeepSeekV3);
  j["num_hidden_layers"] = 8;
  j["moe_layer_freq"] = 2;  // MoE at 4, 6 (i >= 3 and i % 2 == 0)
  const ModelConfig c = parse_hf_config(j, "x");
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_TRUE(c.is_moe_layer(4));
  EXPECT_TRUE(c.is_moe_layer(6));
  EXPECT_FALSE(c.is_moe_layer(3));
  EXPECT_FALSE(c.is_moe_layer(5));
}

TEST(HfConfig, DeepSeekNullQLoraRankMeansUncompressed) {
  json j = json::parse(kDeepSeekV3);
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite writes this
  EXPECT_EQ(parse_hf_config(j, "x").q_lora_rank, 0);
  j.erase("q_lora_rank");
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }),
             "config.json: missing field 'q_lora_rank' (model_type deepseek_v3)");
}

TEST(HfConfig, QwenSparseStepNeedsDenseWidth) {
  json j = json::parse(kQwen3_30B);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {1};
  const ModelConfig c = parse_hf_config(j, "x");
  EXPECT_EQ(c.num_moe_layers(), 23);  // odd layers 3, 5, ..., 47
  EXPECT_FALSE(c.is_moe_layer(1));
  j.erase("intermediate_size");
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "missing field 'intermediate_size'");
}

TEST(HfConfig, MissingFieldNamesFieldAndFamily) {
  json j = json::parse(kDeepSeekV3);
  j.erase("hidden_size");
  EXPECT_EQ(error_of([&] { parse_hf_config(j, "x"); }),
            "config.json: missing field 'hidden_size' (model_type deepseek_v3)");

  struct Case {
    const char* config;
    const char* field;
    const char* family;
  };
  const Case cases[] = {
      {kDeepSeekV3, "n_routed_experts", "deepseek_v3"},
      {kDeepSeekV3, "kv_lora_rank", "deepseek_v3"},
      {kQwen3_30B, "num_experts", "qwen3_moe"},
      {kQwen3_30B, "moe_intermediate_size", "qwen3_moe"},
      {kMixtral8x22B, "num_local_experts", "mixtral"},
      {kMixtral8x22B, "intermediate_size", "mixtral"},
      {kGptOss120B, "head_dim", "gpt_oss"},
      {kQwen15MoE, "shared_expert_intermediate_size", "qwen2_moe"},
      {kLlama31_8B, "vocab_size", "llama"},
  };
  for (const Case& k : cases) {
    json c = json::parse(k.config);
    c.erase(k.field);
    // A field with two accepted spellings names both.
    const std::string field = std::string(k.field) == "num_experts" && std::string(k.family) == "qwen3_moe"
                                  ? "num_experts' or 'num_local_experts"
                                  : k.field;
    EXPECT_EQ(error_of([&] { parse_hf_config(c, "x"); }),
              std::string("config.json: missing field '") + field + "' (model_type " + k.family + ")");
  }
  // null is as good as absent.
  json n = json::parse(kMixtral8x22B);
  n["num_local_experts"] = nullptr;
  EXPECT_HAS(error_of([&] { parse_hf_config(n, "x"); }), "missing field 'num_local_experts'");
}

TEST(HfConfig, WrongTypesAreNamed) {
  json j = json::parse(kMixtral8x22B);
  j["hidden_size"] = "6144";
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }),
             "field 'hidden_size' must be a non-negative integer, got \"6144\"");
  j = json::parse(kMixtral8x22B);
  j["num_hidden_layers"] = -1;
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "'num_hidden_layers'");
  j = json::parse(kMixtral8x22B);
  j["hidden_size"] = 6144.0;  // integral floats are integers
  EXPECT_EQ(parse_hf_config(j, "mixtral-8x22b"), preset_config("mixtral-8x22b"));
  j["hidden_size"] = 6144.5;
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "'hidden_size'");
  j = json::parse(kDeepSeekV3);
  j["scoring_func"] = "relu";
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "'scoring_func'");
  j = json::parse(kQwen3_30B);
  j["tie_word_embeddings"] = 1;
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }),
             "'tie_word_embeddings' must be true or false");
  EXPECT_HAS(error_of([&] { parse_hf_config(json::array({1, 2}), "x"); }), "JSON object");
}

// Found probing the config.json fuzz target with large inputs: mlp_only_layers of 10^6
// repeats of one layer (3 MB) in a 65536-layer model took a minute to plan, every layer
// query scanning the whole list. It is read as the set it is (sorted, repeats dropped)
// and ModelConfig keeps it increasing, so each query is a binary search.
TEST(HfConfig, MlpOnlyLayersAreASet) {
  json j = json::parse(kQwen3_30B);
  j["mlp_only_layers"] = {30, 2, 2, 7};
  EXPECT_EQ(parse_hf_config(j, "x").mlp_only_layers, (std::vector<std::int64_t>{2, 7, 30}));
  j["num_hidden_layers"] = 65536;
  j["mlp_only_layers"] = std::vector<std::int64_t>(1000000, 1);
  const ModelConfig c = parse_hf_config(j, "x");
  EXPECT_EQ(c.mlp_only_layers, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(c.num_moe_layers(), 65535);
}

// Found by tests/fuzz: an error quoted the bad value whole (json::dump, one call per
// nesting level), so a deeply nested one overflowed the stack. Lists and objects are now
// named by kind, long scalars cut (at a UTF-8 character boundary).
TEST(HfConfig, BadValuesAreQuotedBriefly) {
  const std::size_t depth = 1000000;
  json j = json::parse(kMixtral8x22B);
  j["hidden_size"] = json::parse(std::string(depth, '[') + std::string(depth, ']'));
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "field 'hidden_size' must be a non-negative integer, got a list");
  j["hidden_size"] = json::object({{"a", 1}});
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "got an object");
  j["hidden_size"] = std::string(75, 'x') + "\u00e9\u00e9\u00e9";  // 2-byte characters across the cut
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "got \"" + std::string(75, 'x') + "...");  // no half é
}

TEST(HfConfig, ImpossibleValuesFailValidation) {
  json j = json::parse(kMixtral8x22B);
  j["hidden_size"] = 0;
  std::string msg = error_of([&] { parse_hf_config(j, "x"); });
  EXPECT_HAS(msg, "config.json: ");
  EXPECT_HAS(msg, "hidden_size must be > 0");
  EXPECT_HAS(msg, "model_type mixtral");
  j = json::parse(kMixtral8x22B);
  j["num_experts_per_tok"] = 9;
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "top_k (9) exceeds num_experts (8)");
  j = json::parse(kMixtral8x22B);
  j["num_key_value_heads"] = 7;
  EXPECT_HAS(error_of([&] { parse_hf_config(j, "x"); }), "num_kv_heads (7) does not divide");
}

TEST(HfConfig, UnknownModelTypeUsesGenericNames) {
  json j = json::parse(kMixtral8x22B);
  j["model_type"] = "my_moe";
  ModelConfig c = parse_hf_config(j, "mixtral-8x22b");
  EXPECT_EQ(c.family, "my_moe");
  EXPECT_EQ(count_params(c).total, count_params(preset_config("mixtral-8x22b")).total);

  j.erase("num_experts_per_tok");
  const std::string msg = error_of([&] { parse_hf_config(j, "x"); });
  EXPECT_HAS(msg, "missing field 'num_experts_per_tok' or 'experts_per_token'");
  EXPECT_HAS(msg, "model_type my_moe, read with generic field names");

  // An MLA config of an unknown family goes through the DeepSeek field names; Kimi-K2's
  // model_type is DeepSeek-V3's architecture with V3's defaults.
  json d = json::parse(kDeepSeekV3);
  d["model_type"] = "my_mla";
  c = parse_hf_config(d, "deepseek-v3");
  EXPECT_EQ(c.attention, AttentionKind::mla);
  EXPECT_EQ(count_params(c).total, 671026419200);
  d["model_type"] = "kimi_k2";
  d["n_group"] = 1;
  d["topk_group"] = 1;
  d["routed_scaling_factor"] = 2.827;
  c = parse_hf_config(d, "kimi");
  EXPECT_EQ(c.family, "kimi_k2");
  EXPECT_EQ(c.router_scoring, RouterScoring::sigmoid);
  EXPECT_TRUE(c.router_score_correction);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_TRUE(c.merged_shared_experts());
  EXPECT_EQ(count_params(c).total, 671026419200);

  json none = json::parse(kLlama31_8B);
  none.erase("model_type");
  EXPECT_EQ(count_params(parse_hf_config(none, "x")).total, 8030261248);
  none.erase("intermediate_size");
  EXPECT_HAS(error_of([&] { parse_hf_config(none, "x"); }),
             "missing field 'intermediate_size' (model_type not set");
}

TEST_F(HfConfigFiles, LoadsFileOrFolderAndNamesModelAfterFolder) {
  const std::string path = write("DeepSeek-V3/config.json", kDeepSeekV3);
  ModelConfig want = preset_config("deepseek-v3");
  want.name = "DeepSeek-V3";
  EXPECT_EQ(modelled(load_hf_config(path)), want);
  EXPECT_EQ(modelled(load_hf_config((dir_ / "DeepSeek-V3").string())), want);
}

TEST_F(HfConfigFiles, ErrorsNameThePath) {
  const std::string bad = write("broken/config.json", "{\"hidden_size\": 7168,");
  std::string msg = error_of([&] { load_hf_config(bad); });
  EXPECT_HAS(msg, bad);
  EXPECT_HAS(msg, "invalid JSON");
  EXPECT_EQ(msg.find('\n'), std::string::npos);

  const std::string missing = (dir_ / "nope" / "config.json").string();
  msg = error_of([&] { load_hf_config(missing); });
  EXPECT_HAS(msg, "cannot read model config '" + missing + "'");

  json j = json::parse(kQwen3_30B);
  j.erase("num_experts");
  const std::string incomplete = write("q/config.json", j.dump());
  EXPECT_EQ(error_of([&] { load_hf_config(incomplete); }),
            incomplete + ": missing field 'num_experts' or 'num_local_experts' (model_type qwen3_moe)");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The configs transformers 5 writes with save_pretrained (the reference fixtures of
// tests/fixtures/hf): qwen3_moe says num_local_experts, both say rope_parameters.
TEST(HfConfig, ReadsWhatTransformersFiveSaves) {
  for (const char* family : {"qwen3_moe", "mixtral"}) {
    const ModelConfig m = load_hf_config(std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/" + family);
    EXPECT_EQ(m.vocab_size, 256) << family;
    EXPECT_EQ(m.hidden_size, 32) << family;
    EXPECT_EQ(m.num_layers, 2) << family;
    EXPECT_EQ(m.num_experts, 8) << family;
    EXPECT_EQ(m.top_k, 2) << family;
    EXPECT_EQ(m.num_heads, 4) << family;
    EXPECT_EQ(m.num_kv_heads, 2) << family;
    EXPECT_EQ(m.num_moe_layers(), 2) << family;
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

#undef EXPECT_HAS
