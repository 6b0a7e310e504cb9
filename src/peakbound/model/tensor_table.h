// The model's named parameter tensors, derived from a ModelConfig: every weight and
// bias with its Hugging Face safetensors name and shape, as transformers'
// save_pretrained writes them. param_count sums this table by kind, so the names,
// the shapes and the parameter counts come from one place and cannot drift.
//
// Names follow the checkpoint format (transformers 5.24.0, the PyPI release checked):
// since 5.0 transformers fuses routed experts into 3-D parameters in memory
// (mlp.experts.gate_up_proj [E, 2F, H], down_proj [E, H, F]) and converts on load,
// but save_pretrained (save_original_format=True, the default) reverts the
// conversion, so checkpoints keep one tensor per expert. (In memory, 5.x names them
// model.layers.{i}.mlp.experts.gate_up_proj [E, 2F, H] = cat(gate, up) on dim 1 and
// mlp.experts.down_proj [E, H, F], and renames Mixtral's block_sparse_moe to mlp;
// conversion_mapping.py holds the mapping.) Checkpoint names:
//   qwen3_moe / qwen2_moe / deepseek: model.layers.{i}.mlp.experts.{e}.gate_proj.weight
//   mixtral:  model.layers.{i}.block_sparse_moe.experts.{e}.w1 / w3 / w2.weight
// gpt_oss is the exception: its checkpoint stores experts fused, one entry per
// layer (expert index -1) with the expert count leading the shape.
//
// Shapes are PyTorch's: a Linear weight is [out, in], a bias [out].
// DeepSeek's multi-token-prediction layer (model.layers.{num_layers}.*) is not in the
// table: transformers does not load it; param_count adds it from the table's layer sums.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/model/model_config.h"

namespace peakbound {

// What a tensor belongs to. Norms inside attention (Qwen3's q_norm / k_norm, MLA's
// q_a_layernorm / kv_a_layernorm) and gpt-oss's sinks are `attention`; `norm` is
// the per-layer input / post-attention RMSNorms and the final norm. Router biases
// and DeepSeek's e_score_correction_bias are `router`; Qwen2-MoE's
// shared_expert_gate is `shared_expert`.
enum class TensorKind : std::uint8_t {
  embedding, attention, norm, router, expert, shared_expert, dense_mlp, head
};
inline constexpr int kNumTensorKinds = 8;
std::string_view tensor_kind_name(TensorKind k);

// One parameter tensor. layer / expert are -1 where the tensor belongs to none.
struct TensorEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  TensorKind kind = TensorKind::embedding;
  std::int64_t layer = -1;
  std::int64_t expert = -1;
  bool expert_sharded = false;  // split across ranks by expert parallelism (dim 0 if fused)
  bool vocab_sharded = false;   // split across ranks by vocabulary rows (dim 0)
  std::int64_t numel() const;
};

// True for a checkpoint tensor that is model state but not a trained parameter: DeepSeek's
// mlp.gate.e_score_correction_bias (a torch buffer, moved between steps by the
// auxiliary-loss-free update, not by gradients). The trainer holds these apart from the
// parameters it optimizes (f32, replicated) and checkpoints and exports them by name.
bool is_router_buffer(const TensorEntry& e);

// One tensor of a group, before the layer / expert index is substituted. `name`
// is relative: to "model.layers.{i}." for layer groups, to the experts prefix plus
// "{e}." for per-expert templates. For a fused expert template, `shape` is one
// expert's and the expanded entry's shape is [E, shape...].
struct TensorTemplate {
  std::string name;
  std::vector<std::int64_t> shape;
  TensorKind kind = TensorKind::embedding;
  std::int64_t numel = 0;  // product of shape (one expert's for expert templates)
};

// Element counts per kind for one group.
using KindNumel = std::array<std::int64_t, kNumTensorKinds>;

// The table in compact form: groups of templates and how many times each repeats.
// Counting is O(templates); names are expanded only by for_each / entries, in
// checkpoint order (embedding, layer 0 ... L-1, final norm, lm_head; within a layer
// attention, norms, then the MLP with experts in index order).
// Which names and shapes the table gives gpt-oss's routed experts (every other family's
// are the same in both): `checkpoint`, the fused tensors its files hold (above); `trainer`,
// one entry per expert as the trainer packs them (train/gpt_oss_experts.h), in nn.Linear
// layout and this order: mlp.experts.{e}.gate_proj.weight [F, H], up_proj.weight [F, H],
// down_proj.weight [H, F], gate_proj.bias [F], up_proj.bias [F], down_proj.bias [H]. The
// element counts are equal; the loader and the exporter convert between the two.
enum class TableLayout : std::uint8_t { checkpoint, trainer };

class TensorTable {
 public:
  // Validates the config (InvalidArgument on an impossible one, or when a size
  // product overflows 64 bits).
  explicit TensorTable(const ModelConfig& config, TableLayout layout = TableLayout::checkpoint);

  const ModelConfig& config() const { return config_; }
  TableLayout layout() const { return layout_; }
  // The trainer layout of a family whose experts the checkpoint stores fused (gpt-oss).
  bool converts_experts() const { return layout_ == TableLayout::trainer && config_.family == "gpt_oss"; }

  // Templates: model-level tensors with full names (embed_tokens; norm and lm_head).
  const std::vector<TensorTemplate>& head_tensors() const { return head_; }
  const std::vector<TensorTemplate>& tail_tensors() const { return tail_; }
  // Layer tensors: a dense layer in full; an MoE layer without its routed experts.
  const std::vector<TensorTemplate>& dense_layer_tensors() const { return dense_layer_; }
  const std::vector<TensorTemplate>& moe_layer_tensors() const { return moe_layer_; }
  // One routed expert's tensors, relative to experts_prefix() + "{e}.".
  const std::vector<TensorTemplate>& expert_tensors() const { return expert_; }
  const std::string& experts_prefix() const { return experts_prefix_; }  // "mlp.experts."
  bool experts_fused() const { return fused_experts_; }

  // Per-group sums by kind. moe_layer excludes routed experts; expert is one expert.
  const KindNumel& head_numel() const { return head_sum_; }
  const KindNumel& tail_numel() const { return tail_sum_; }
  const KindNumel& dense_layer_numel() const { return dense_sum_; }
  const KindNumel& moe_layer_numel() const { return moe_sum_; }
  const KindNumel& expert_numel() const { return expert_sum_; }

  // Whole-model element count of one kind, and of all kinds.
  std::int64_t numel(TensorKind k) const { return total_[static_cast<int>(k)]; }
  std::int64_t total_numel() const { return total_all_; }

  // Number of entries for_each visits.
  std::int64_t size() const { return size_; }
  // Visits every entry, expanded, in checkpoint order. The entry is reused between
  // calls: copy it to keep it.
  void for_each(const std::function<void(const TensorEntry&)>& fn) const;
  std::vector<TensorEntry> entries() const;

 private:
  ModelConfig config_;
  TableLayout layout_ = TableLayout::checkpoint;
  std::vector<TensorTemplate> head_, tail_, dense_layer_, moe_layer_, expert_;
  std::string experts_prefix_;
  bool fused_experts_ = false;
  KindNumel head_sum_{}, tail_sum_{}, dense_sum_{}, moe_sum_{}, expert_sum_{};
  KindNumel total_{};
  std::int64_t total_all_ = 0;
  std::int64_t size_ = 0;
};

}  // namespace peakbound
