// Parameter counts against hand-written tensor lists: every weight of tiny-moe,
// and the per-layer tensors of each architecture feature (MLA, sinks, biases,
// q/k norms, shared experts, tied embeddings, layer placement).
#include "peakbound/model/param_count.h"

#include <gtest/gtest.h>

#include "peakbound/core/error.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(ParamCount, TinyMoeEveryTensor) {
  // tiny-moe: V=16384, H=256, 4 layers (layer 0 dense, 1-3 MoE), 8 heads / 2 kv
  // heads of 32, dense MLP 1024, 8 experts of 512, top-2, untied.
  const std::int64_t embed_tokens = 16384 * 256;  // model.embed_tokens.weight
  const std::int64_t lm_head = 16384 * 256;       // lm_head.weight
  const std::int64_t q_proj = 256 * 256;          // [8*32, 256]
  const std::int64_t k_proj = 64 * 256;           // [2*32, 256]
  const std::int64_t v_proj = 64 * 256;           // [2*32, 256]
  const std::int64_t o_proj = 256 * 256;          // [256, 8*32]
  const std::int64_t attn = q_proj + k_proj + v_proj + o_proj;
  const std::int64_t layer_norms = 256 + 256;     // input_layernorm, post_attention_layernorm
  const std::int64_t dense_mlp = 1024 * 256 + 1024 * 256 + 256 * 1024;  // gate, up, down
  const std::int64_t expert = 512 * 256 + 512 * 256 + 256 * 512;        // gate, up, down
  const std::int64_t router = 8 * 256;            // mlp.gate.weight [E, H]
  const std::int64_t final_norm = 256;            // model.norm.weight

  const std::int64_t layer0 = attn + layer_norms + dense_mlp;
  const std::int64_t moe_layer = attn + layer_norms + router + 8 * expert;
  const std::int64_t total = embed_tokens + lm_head + layer0 + 3 * moe_layer + final_norm;
  ASSERT_EQ(total, 19276032);  // the arithmetic above, written out

  const ParamCount p = count_params(preset_config("tiny-moe"));
  EXPECT_EQ(p.embedding, embed_tokens);
  EXPECT_EQ(p.lm_head, lm_head);
  EXPECT_EQ(p.attention, 4 * attn);
  EXPECT_EQ(p.dense_mlp, dense_mlp);
  EXPECT_EQ(p.routed_experts, 3 * 8 * expert);
  EXPECT_EQ(p.shared_experts, 0);
  EXPECT_EQ(p.router, 3 * router);
  EXPECT_EQ(p.norms, 4 * layer_norms + final_norm);
  EXPECT_EQ(p.total, total);
  // Each token visits 2 of 8 experts: 6 unvisited experts in each of 3 layers.
  EXPECT_EQ(p.active, total - 3 * 6 * expert);
  EXPECT_EQ(p.active_non_embedding, total - 3 * 6 * expert - embed_tokens);
  EXPECT_EQ(p.mtp, 0);
  EXPECT_EQ(p.num_dense_layers, 1);
  EXPECT_EQ(p.num_moe_layers, 3);
  EXPECT_EQ(p.routed_expert, expert);
  EXPECT_EQ(p.attention_per_layer, attn);
  EXPECT_EQ(p.dense_layer, layer0);
  EXPECT_EQ(p.moe_layer_non_expert, attn + layer_norms + router);
  EXPECT_EQ(p.moe_layer, moe_layer);
}

TEST(ParamCount, DeepSeekV3MlaAndMoeLayer) {
  const ParamCount p = count_params(preset_config("deepseek-v3"));
  const std::int64_t H = 7168;
  const std::int64_t mla = H * 1536             // q_a_proj
                           + 1536               // q_a_layernorm
                           + 1536 * 128 * 192   // q_b_proj: heads * (nope 128 + rope 64)
                           + H * (512 + 64)     // kv_a_proj_with_mqa
                           + 512                // kv_a_layernorm
                           + 512 * 128 * 256    // kv_b_proj: heads * (nope 128 + v 128)
                           + 128 * 128 * H;     // o_proj
  EXPECT_EQ(mla, 187107328);
  EXPECT_EQ(p.attention_per_layer, mla);
  EXPECT_EQ(p.routed_expert, 3 * H * 2048);
  // gate.weight [256, H] and gate.e_score_correction_bias [256].
  const std::int64_t router = 256 * H + 256;
  EXPECT_EQ(p.router, 58 * router);
  EXPECT_EQ(p.shared_experts, 58 * 3 * H * 2048);
  EXPECT_EQ(p.moe_layer_non_expert, mla + 2 * H + router + 3 * H * 2048);
  EXPECT_EQ(p.dense_layer, mla + 2 * H + 3 * H * 18432);
  EXPECT_EQ(p.num_dense_layers, 3);
  EXPECT_EQ(p.num_moe_layers, 58);
  // MTP: enorm, hnorm, eh_proj [H, 2H], one MoE layer, shared_head.norm.
  EXPECT_EQ(p.mtp, 2 * H + 2 * H * H + p.moe_layer + H);
  EXPECT_EQ(p.mtp_checkpoint_copies, 2 * 129280 * H);
  EXPECT_EQ(p.total, 671026419200);
}

TEST(ParamCount, MlaWithoutQueryCompression) {
  ModelConfig c = preset_config("deepseek-v3");
  const std::int64_t before = count_params(c).attention_per_layer;
  c.q_lora_rank = 0;  // q_proj [128*192, H] replaces q_a_proj, q_a_layernorm, q_b_proj
  const std::int64_t H = 7168;
  EXPECT_EQ(count_params(c).attention_per_layer,
            before - (H * 1536 + 1536 + 1536 * 128 * 192) + H * 128 * 192);
}

TEST(ParamCount, MlaAttentionBiasOnlyOnCompressionAndOutput) {
  ModelConfig c = preset_config("deepseek-v3");
  const std::int64_t before = count_params(c).attention_per_layer;
  c.attention_qkv_bias = c.attention_out_bias = true;
  // q_a_proj [1536], kv_a_proj_with_mqa [512 + 64], o_proj [H]; not q_b/kv_b.
  EXPECT_EQ(count_params(c).attention_per_layer, before + 1536 + 576 + 7168);
}

TEST(ParamCount, GptOssBiasesSinksAndRouterBias) {
  const ParamCount p = count_params(preset_config("gpt-oss-120b"));
  const std::int64_t H = 2880;
  const std::int64_t attn = (H * 4096 + 4096)   // q_proj + bias
                            + 2 * (H * 512 + 512)  // k_proj, v_proj + biases
                            + (4096 * H + H)    // o_proj + bias
                            + 64;               // sinks [num_heads]
  EXPECT_EQ(attn, 26550144);
  EXPECT_EQ(p.attention_per_layer, attn);
  // gate_up_proj [H, 2I] + bias [2I], down_proj [I, H] + bias [H], I = 2880.
  EXPECT_EQ(p.routed_expert, H * 2 * 2880 + 2 * 2880 + 2880 * H + H);
  EXPECT_EQ(p.router, 36 * (128 * H + 128));  // router weight and bias
  EXPECT_EQ(p.embedding + p.lm_head, 2 * 201088 * H);
  EXPECT_EQ(p.total, 116829156672);
}

TEST(ParamCount, Qwen3QkNormIsPerHeadDim) {
  const ParamCount p = count_params(preset_config("qwen3-30b-a3b"));
  const std::int64_t H = 2048;
  EXPECT_EQ(p.attention_per_layer, H * 4096 + 2 * H * 512 + 4096 * H + 2 * 128);
  EXPECT_EQ(p.total, 30532122624);
}

TEST(ParamCount, TiedEmbeddingsDropLmHead) {
  ModelConfig c = preset_config("tiny-moe");
  const ParamCount untied = count_params(c);
  c.tie_word_embeddings = true;
  const ParamCount tied = count_params(c);
  EXPECT_EQ(tied.lm_head, 0);
  EXPECT_EQ(tied.total, untied.total - 16384 * 256);
  EXPECT_EQ(tied.active, untied.active - 16384 * 256);
}

TEST(ParamCount, Qwen2StyleGatedSharedExpert) {
  ModelConfig c = preset_config("tiny-moe");
  const ParamCount base = count_params(c);
  c.num_shared_experts = 1;
  c.shared_expert_intermediate_size = 1024;
  c.shared_expert_gate = true;
  const ParamCount p = count_params(c);
  const std::int64_t shared = 3 * 256 * 1024 + 256;  // MLP of width 1024, gate [1, H]
  EXPECT_EQ(p.shared_experts, 3 * shared);
  EXPECT_EQ(p.total, base.total + 3 * shared);
  // Shared experts are always active.
  EXPECT_EQ(p.active, base.active + 3 * shared);
}

TEST(ParamCount, DeepSeekStyleSharedExpertsUseExpertWidth) {
  ModelConfig c = preset_config("tiny-moe");
  c.num_shared_experts = 2;
  EXPECT_EQ(count_params(c).shared_experts, 3 * 2 * (3 * 256 * 512));
}

TEST(ParamCount, SparseStepAndMlpOnlyLayersPlaceMoe) {
  ModelConfig c = preset_config("tiny-moe");
  c.num_layers = 8;
  c.num_dense_layers = 0;
  c.moe_layer_step = 2;        // MoE at layers 1, 3, 5, 7
  c.mlp_only_layers = {3};     // ... but 3 is forced dense
  const ParamCount p = count_params(c);
  EXPECT_EQ(p.num_moe_layers, 3);
  EXPECT_EQ(p.num_dense_layers, 5);
  EXPECT_EQ(p.dense_mlp, 5 * 3 * 256 * 1024);
  EXPECT_EQ(p.routed_experts, 3 * 8 * 3 * 256 * 512);
}

TEST(ParamCount, DenseModelIsFullyActive) {
  ModelConfig c = preset_config("tiny-moe");
  c.num_experts = c.top_k = 0;
  c.moe_intermediate_size = 0;
  const ParamCount p = count_params(c);
  EXPECT_EQ(p.num_moe_layers, 0);
  EXPECT_EQ(p.routed_experts, 0);
  EXPECT_EQ(p.router, 0);
  EXPECT_EQ(p.active, p.total);
  EXPECT_EQ(p.dense_mlp, 4 * 3 * 256 * 1024);
}

TEST(ParamCount, BreakdownSumsToTotalForEveryPreset) {
  for (const std::string& name : preset_names()) {
    const ParamCount p = count_params(preset_config(name));
    EXPECT_EQ(p.embedding + p.lm_head + p.attention + p.dense_mlp + p.routed_experts +
                  p.shared_experts + p.router + p.norms,
              p.total)
        << name;
    EXPECT_EQ(p.num_dense_layers * p.dense_layer + p.num_moe_layers * p.moe_layer +
                  p.embedding + p.lm_head + preset_config(name).hidden_size,
              p.total)
        << name << ": layers + embeddings + final norm";
    EXPECT_LT(p.active, p.total) << name;
  }
}

TEST(ParamCount, OverflowIsAnError) {
  ModelConfig c = preset_config("tiny-moe");
  c.num_layers = 1 << 16;
  c.num_experts = 1 << 30;
  c.moe_intermediate_size = 1 << 30;
  c.hidden_size = 1 << 30;
  try {
    count_params(c);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
}

TEST(ParamCount, InvalidConfigIsRejected) {
  ModelConfig c = preset_config("tiny-moe");
  c.hidden_size = 0;
  EXPECT_THROW(count_params(c), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
