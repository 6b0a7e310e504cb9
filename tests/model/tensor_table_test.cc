// The named tensor table against hand-written Hugging Face checkpoint lists (tiny
// Qwen3-MoE and Mixtral), its totals against count_params for every preset, and
// name uniqueness.
#include "peakbound/model/tensor_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "peakbound/model/param_count.h"
#include "peakbound/model/presets.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Want {
  std::string name;
  std::vector<std::int64_t> shape;
  TensorKind kind;
  std::int64_t layer;
  std::int64_t expert;
};

// V=11, H=6, 2 layers, 2 heads of D=4 with 1 kv head, E=3 experts of F=5, top-2.
ModelConfig tiny(const std::string& family) {
  ModelConfig c;
  c.name = "tiny-" + family;
  c.family = family;
  c.vocab_size = 11;
  c.hidden_size = 6;
  c.num_layers = 2;
  c.num_experts = 3;
  c.top_k = 2;
  c.moe_intermediate_size = 5;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.qk_norm = family == "qwen3_moe";
  return c;
}

void expect_entries(const TensorTable& table, const std::vector<Want>& want) {
  const std::vector<TensorEntry> got = table.entries();
  ASSERT_EQ(static_cast<std::int64_t>(got.size()), table.size());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].shape, want[i].shape);
    EXPECT_EQ(got[i].kind, want[i].kind);
    EXPECT_EQ(got[i].layer, want[i].layer);
    EXPECT_EQ(got[i].expert, want[i].expert);
    EXPECT_EQ(got[i].expert_sharded, want[i].kind == TensorKind::expert);
    EXPECT_EQ(got[i].vocab_sharded,
              want[i].kind == TensorKind::embedding || want[i].kind == TensorKind::head);
  }
}

using K = TensorKind;

TEST(TensorTable, TinyQwen3MoeEveryTensor) {
  std::vector<Want> want = {{"model.embed_tokens.weight", {11, 6}, K::embedding, -1, -1}};
  for (std::int64_t i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    want.push_back({l + "input_layernorm.weight", {6}, K::norm, i, -1});
    want.push_back({l + "self_attn.q_proj.weight", {8, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.k_proj.weight", {4, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.v_proj.weight", {4, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.o_proj.weight", {6, 8}, K::attention, i, -1});
    want.push_back({l + "self_attn.q_norm.weight", {4}, K::attention, i, -1});
    want.push_back({l + "self_attn.k_norm.weight", {4}, K::attention, i, -1});
    want.push_back({l + "post_attention_layernorm.weight", {6}, K::norm, i, -1});
    want.push_back({l + "mlp.gate.weight", {3, 6}, K::router, i, -1});
    for (std::int64_t e = 0; e < 3; ++e) {
      const std::string x = l + "mlp.experts." + std::to_string(e) + ".";
      want.push_back({x + "gate_proj.weight", {5, 6}, K::expert, i, e});
      want.push_back({x + "up_proj.weight", {5, 6}, K::expert, i, e});
      want.push_back({x + "down_proj.weight", {6, 5}, K::expert, i, e});
    }
  }
  want.push_back({"model.norm.weight", {6}, K::norm, -1, -1});
  want.push_back({"lm_head.weight", {11, 6}, K::head, -1, -1});
  const TensorTable table(tiny("qwen3_moe"));
  expect_entries(table, want);
  // 66 + 2 * (6 + 48 + 24 + 24 + 48 + 8 + 6 + 18 + 3 * 90) + 6 + 66
  EXPECT_EQ(table.total_numel(), 66 + 2 * 452 + 6 + 66);
  EXPECT_EQ(table.numel(K::expert), 2 * 3 * 90);
}

TEST(TensorTable, TinyMixtralEveryTensor) {
  std::vector<Want> want = {{"model.embed_tokens.weight", {11, 6}, K::embedding, -1, -1}};
  for (std::int64_t i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    want.push_back({l + "input_layernorm.weight", {6}, K::norm, i, -1});
    want.push_back({l + "self_attn.q_proj.weight", {8, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.k_proj.weight", {4, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.v_proj.weight", {4, 6}, K::attention, i, -1});
    want.push_back({l + "self_attn.o_proj.weight", {6, 8}, K::attention, i, -1});
    want.push_back({l + "post_attention_layernorm.weight", {6}, K::norm, i, -1});
    want.push_back({l + "block_sparse_moe.gate.weight", {3, 6}, K::router, i, -1});
    for (std::int64_t e = 0; e < 3; ++e) {
      const std::string x = l + "block_sparse_moe.experts." + std::to_string(e) + ".";
      want.push_back({x + "w1.weight", {5, 6}, K::expert, i, e});  // gate
      want.push_back({x + "w3.weight", {5, 6}, K::expert, i, e});  // up
      want.push_back({x + "w2.weight", {6, 5}, K::expert, i, e});  // down
    }
  }
  want.push_back({"model.norm.weight", {6}, K::norm, -1, -1});
  want.push_back({"lm_head.weight", {11, 6}, K::head, -1, -1});
  expect_entries(TensorTable(tiny("mixtral")), want);
}

TEST(TensorTable, DenseLayersTiedEmbeddingsAndSharedExperts) {
  ModelConfig c = tiny("qwen2_moe");
  c.mlp_only_layers = {0};
  c.dense_intermediate_size = 7;
  c.num_shared_experts = 1;
  c.shared_expert_intermediate_size = 9;
  c.shared_expert_gate = true;
  c.tie_word_embeddings = true;
  const TensorTable t(c);
  std::set<std::string> names;
  t.for_each([&](const TensorEntry& e) { names.insert(e.name); });
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(names.count("model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.shared_expert.down_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.count("lm_head.weight"));
  EXPECT_EQ(t.numel(K::dense_mlp), 3 * 7 * 6);
  EXPECT_EQ(t.numel(K::shared_expert), 3 * 9 * 6 + 6);
}

TEST(TensorTable, DeepSeekMlaAndGptOssFusedExperts) {
  std::set<std::string> ds;
  TensorTable(preset_config("deepseek-v3")).for_each([&](const TensorEntry& e) {
    if (e.layer == 3 && e.expert < 0) ds.insert(e.name + " " + std::to_string(e.numel()));
  });
  EXPECT_TRUE(ds.count("model.layers.3.self_attn.q_a_proj.weight " + std::to_string(1536 * 7168)));
  EXPECT_TRUE(ds.count("model.layers.3.self_attn.kv_a_proj_with_mqa.weight " + std::to_string(576 * 7168)));
  EXPECT_TRUE(ds.count("model.layers.3.self_attn.kv_b_proj.weight " + std::to_string(128 * 256 * 512)));
  EXPECT_TRUE(ds.count("model.layers.3.mlp.gate.e_score_correction_bias 256"));
  EXPECT_TRUE(ds.count("model.layers.3.mlp.shared_experts.gate_proj.weight " + std::to_string(2048 * 7168)));

  std::vector<TensorEntry> fused;
  TensorTable(preset_config("gpt-oss-120b")).for_each([&](const TensorEntry& e) {
    if (e.layer == 0 && e.kind == K::expert) fused.push_back(e);
  });
  ASSERT_EQ(fused.size(), 4u);
  EXPECT_EQ(fused[0].name, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(fused[0].shape, (std::vector<std::int64_t>{128, 2880, 5760}));
  EXPECT_EQ(fused[0].expert, -1);
  EXPECT_TRUE(fused[0].expert_sharded);
}

// The table is the single source of the counts: for every preset its sums by kind
// and the expanded entries' element counts agree with count_params, and no name repeats.
TEST(TensorTable, TotalsEqualCountParamsAndNamesAreUnique) {
  for (const std::string& name : preset_names()) {
    const Preset& p = find_preset(name);
    SCOPED_TRACE(name);
    const TensorTable t(p.config);
    const ParamCount c = count_params(p.config);
    EXPECT_EQ(t.total_numel(), c.total);
    EXPECT_EQ(t.numel(K::embedding), c.embedding);
    EXPECT_EQ(t.numel(K::head), c.lm_head);
    EXPECT_EQ(t.numel(K::attention), c.attention);
    EXPECT_EQ(t.numel(K::expert), c.routed_experts);
    EXPECT_EQ(t.numel(K::norm), c.norms);
    std::set<std::string> names;
    std::int64_t numel = 0, visited = 0;
    t.for_each([&](const TensorEntry& e) {
      EXPECT_TRUE(names.insert(e.name).second) << e.name;
      numel += e.numel();
      ++visited;
    });
    EXPECT_EQ(numel, c.total);
    EXPECT_EQ(visited, t.size());
  }
}

// Counting works from the per-layer templates (no timing here: tests assert no speed).
TEST(TensorTable, DeepSeekEntryCount) {
  const ModelConfig c = preset_config("deepseek-v3");
  EXPECT_EQ(TensorTable(c).size(), 3 + 3 * 12 + 58 * (14 + 256 * 3));  // 45395 entries
  EXPECT_EQ(TensorTable(c).total_numel(), count_params(c).total);  // total excludes MTP, as the table does
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
