#include "peakbound/model/param_count.h"

#include <initializer_list>

#include "peakbound/core/error.h"
#include "peakbound/model/tensor_table.h"

namespace peakbound {

namespace {

// Checked arithmetic for the sums below (the table checks its own products).
class Counter {
 public:
  explicit Counter(const std::string& name) : name_(name) {}

  std::int64_t mul(std::initializer_list<std::int64_t> factors) const {
    std::int64_t r = 1;
    for (std::int64_t f : factors)
      if (__builtin_mul_overflow(r, f, &r)) overflow();
    return r;
  }
  std::int64_t add(std::initializer_list<std::int64_t> terms) const {
    std::int64_t r = 0;
    for (std::int64_t t : terms)
      if (__builtin_add_overflow(r, t, &r)) overflow();
    return r;
  }

 private:
  [[noreturn]] void overflow() const {
    throw InvalidArgument("model '" + name_ + "': parameter count overflows 64 bits");
  }
  std::string name_;
};

std::int64_t of(const KindNumel& k, TensorKind kind) { return k[static_cast<int>(kind)]; }

std::int64_t sum(const Counter& n, const KindNumel& k) {
  std::int64_t r = 0;
  for (std::int64_t v : k) r = n.add({r, v});
  return r;
}

}  // namespace

// Every figure is a sum over the named tensor table (model/tensor_table.h), so the
// counts and the checkpoint's tensors cannot disagree.
ParamCount count_params(const ModelConfig& c) {
  const TensorTable table(c);  // validates
  const Counter n(c.name);
  const std::int64_t H = c.hidden_size;
  ParamCount p;

  p.num_moe_layers = c.num_moe_layers();
  p.num_dense_layers = c.num_layers - p.num_moe_layers;

  const KindNumel& dense = table.dense_layer_numel();
  const KindNumel& moe = table.moe_layer_numel();
  // Attention is the same in both layer kinds; take it from whichever exists.
  p.attention_per_layer = of(p.num_moe_layers > 0 ? moe : dense, TensorKind::attention);
  if (p.num_dense_layers > 0) p.dense_layer = sum(n, dense);
  if (c.num_experts > 0) {
    p.routed_expert = sum(n, table.expert_numel());
    p.moe_layer_non_expert = sum(n, moe);
    p.moe_layer = n.add({p.moe_layer_non_expert, n.mul({c.num_experts, p.routed_expert})});
  }

  p.embedding = table.numel(TensorKind::embedding);
  p.lm_head = table.numel(TensorKind::head);
  p.attention = table.numel(TensorKind::attention);
  p.dense_mlp = table.numel(TensorKind::dense_mlp);
  p.routed_experts = table.numel(TensorKind::expert);
  p.shared_experts = table.numel(TensorKind::shared_expert);
  p.router = table.numel(TensorKind::router);
  p.norms = table.numel(TensorKind::norm);
  p.total = table.total_numel();

  const std::int64_t unvisited =
      n.mul({p.num_moe_layers, c.num_experts - c.top_k, p.routed_expert});
  p.active = p.total - unvisited;
  p.active_non_embedding = p.active - p.embedding;

  if (c.num_mtp_layers > 0) {
    // One MTP module: enorm, hnorm [H]; eh_proj [H, 2H]; a decoder layer (MoE when
    // the model has experts, as DeepSeek's layer 61 is); shared_head.norm [H].
    const std::int64_t block = c.num_experts > 0 ? p.moe_layer : p.dense_layer;
    const std::int64_t per_module = n.add({2 * H, n.mul({2 * H, H}), block, H});
    p.mtp = n.mul({c.num_mtp_layers, per_module});
    p.mtp_checkpoint_copies = n.mul({c.num_mtp_layers, n.add({p.embedding, p.lm_head})});
  }
  return p;
}

}  // namespace peakbound
