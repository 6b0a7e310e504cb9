#include "peakbound/model/tensor_table.h"

#include "peakbound/core/error.h"

namespace peakbound {

bool is_router_buffer(const TensorEntry& e) {
  static constexpr std::string_view kSuffix = ".e_score_correction_bias";
  return e.kind == TensorKind::router && e.name.ends_with(kSuffix);
}

std::string_view tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::embedding: return "embedding";
    case TensorKind::attention: return "attention";
    case TensorKind::norm: return "norm";
    case TensorKind::router: return "router";
    case TensorKind::expert: return "expert";
    case TensorKind::shared_expert: return "shared_expert";
    case TensorKind::dense_mlp: return "dense_mlp";
    case TensorKind::head: return "head";
  }
  return "unknown";
}

std::int64_t TensorEntry::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

// Sizes are validated to be <= 2^30 each, but products over layers and experts of
// an absurd config can still pass 2^63: check every step rather than wrap.
class Checked {
 public:
  explicit Checked(const std::string& name) : name_(name) {}
  std::int64_t mul(std::int64_t a, std::int64_t b) const {
    std::int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) overflow();
    return r;
  }
  std::int64_t add(std::int64_t a, std::int64_t b) const {
    std::int64_t r;
    if (__builtin_add_overflow(a, b, &r)) overflow();
    return r;
  }

 private:
  [[noreturn]] void overflow() const {
    throw InvalidArgument("model '" + name_ + "': parameter count overflows 64 bits");
  }
  std::string name_;
};

// Appends templates to one group, computing each numel with overflow checks.
class Group {
 public:
  Group(std::vector<TensorTemplate>& out, const Checked& n) : out_(out), n_(n) {}

  void add(std::string name, std::vector<std::int64_t> shape, TensorKind kind) {
    std::int64_t numel = 1;
    for (std::int64_t d : shape) numel = n_.mul(numel, d);
    out_.push_back(TensorTemplate{std::move(name), std::move(shape), kind, numel});
  }
  // A Linear in -> out: "<name>.weight" [out, in] and, with bias, "<name>.bias" [out].
  void linear(const std::string& name, std::int64_t in, std::int64_t out, bool bias, TensorKind kind) {
    add(name + ".weight", {out, in}, kind);
    if (bias) add(name + ".bias", {out}, kind);
  }
  // A SwiGLU MLP under `prefix` with the given gate / up / down module names.
  void gated_mlp(const std::string& prefix, std::int64_t hidden, std::int64_t width, bool bias,
                 TensorKind kind, const char* gate = "gate_proj", const char* up = "up_proj",
                 const char* down = "down_proj") {
    linear(prefix + gate, hidden, width, bias, kind);
    linear(prefix + up, hidden, width, bias, kind);
    linear(prefix + down, width, hidden, bias, kind);
  }

 private:
  std::vector<TensorTemplate>& out_;
  const Checked& n_;
};

void gqa_attention(Group& g, const ModelConfig& c) {
  const std::int64_t H = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const TensorKind a = TensorKind::attention;
  g.linear("self_attn.q_proj", H, q, c.attention_qkv_bias, a);
  g.linear("self_attn.k_proj", H, kv, c.attention_qkv_bias, a);
  g.linear("self_attn.v_proj", H, kv, c.attention_qkv_bias, a);
  g.linear("self_attn.o_proj", q, H, c.attention_out_bias, a);
  if (c.qk_norm) {
    g.add("self_attn.q_norm.weight", {c.head_dim}, a);
    g.add("self_attn.k_norm.weight", {c.head_dim}, a);
  }
  if (c.attention_sinks) g.add("self_attn.sinks", {c.num_heads}, a);
}

// DeepSeek-V2/V3 MLA (modeling_deepseek_v3.py). Only q_a_proj, kv_a_proj_with_mqa
// and o_proj take attention_bias; q_b_proj, kv_b_proj and a plain q_proj do not.
void mla_attention(Group& g, const ModelConfig& c) {
  const std::int64_t H = c.hidden_size, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const TensorKind a = TensorKind::attention;
  if (c.q_lora_rank > 0) {
    g.linear("self_attn.q_a_proj", H, c.q_lora_rank, c.attention_qkv_bias, a);
    g.add("self_attn.q_a_layernorm.weight", {c.q_lora_rank}, a);
    g.linear("self_attn.q_b_proj", c.q_lora_rank, c.num_heads * qk, false, a);
  } else {
    g.linear("self_attn.q_proj", H, c.num_heads * qk, false, a);
  }
  g.linear("self_attn.kv_a_proj_with_mqa", H, c.kv_lora_rank + c.qk_rope_head_dim,
           c.attention_qkv_bias, a);
  g.add("self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, a);
  g.linear("self_attn.kv_b_proj", c.kv_lora_rank,
           c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), false, a);
  g.linear("self_attn.o_proj", c.num_heads * c.v_head_dim, H, c.attention_out_bias, a);
  if (c.attention_sinks) g.add("self_attn.sinks", {c.num_heads}, a);
}

// Attention and the two per-layer norms, shared by dense and MoE layers.
void layer_common(Group& g, const ModelConfig& c) {
  g.add("input_layernorm.weight", {c.hidden_size}, TensorKind::norm);
  if (c.attention == AttentionKind::mla) mla_attention(g, c);
  else gqa_attention(g, c);
  g.add("post_attention_layernorm.weight", {c.hidden_size}, TensorKind::norm);
}

KindNumel sum_by_kind(const std::vector<TensorTemplate>& ts, const Checked& n) {
  KindNumel s{};
  for (const TensorTemplate& t : ts) {
    std::int64_t& slot = s[static_cast<int>(t.kind)];
    slot = n.add(slot, t.numel);
  }
  return s;
}

}  // namespace

TensorTable::TensorTable(const ModelConfig& c, TableLayout layout) : config_(c), layout_(layout) {
  c.validate();
  const Checked n(c.name);
  const std::int64_t H = c.hidden_size;

  Group head(head_, n);
  head.add("model.embed_tokens.weight", {c.vocab_size, H}, TensorKind::embedding);
  Group tail(tail_, n);
  tail.add("model.norm.weight", {H}, TensorKind::norm);
  if (!c.tie_word_embeddings) tail.add("lm_head.weight", {c.vocab_size, H}, TensorKind::head);

  const std::int64_t num_moe = c.num_moe_layers();
  const std::int64_t num_dense = c.num_layers - num_moe;

  if (num_dense > 0) {
    Group g(dense_layer_, n);
    layer_common(g, c);
    g.gated_mlp("mlp.", H, c.dense_intermediate_size, c.mlp_bias, TensorKind::dense_mlp);
  }

  if (c.num_experts > 0) {
    Group g(moe_layer_, n);
    layer_common(g, c);
    const std::int64_t E = c.num_experts;
    const bool mixtral = c.family == "mixtral";
    const bool gpt_oss = c.family == "gpt_oss";
    // Router.
    if (mixtral) {
      g.linear("block_sparse_moe.gate", H, E, c.router_bias, TensorKind::router);
    } else if (gpt_oss) {
      g.linear("mlp.router", H, E, c.router_bias, TensorKind::router);
    } else {
      g.linear("mlp.gate", H, E, c.router_bias, TensorKind::router);
    }
    if (c.router_score_correction)
      g.add("mlp.gate.e_score_correction_bias", {E}, TensorKind::router);
    // Shared experts. DeepSeek stores its shared experts as one MLP of width
    // n_shared_experts * moe_intermediate_size (same count without biases);
    // Qwen2-MoE names its single one shared_expert (singular) and gates it.
    const std::int64_t S = c.num_shared_experts, W = c.shared_expert_width();
    const TensorKind sk = TensorKind::shared_expert;
    if (S > 0 && c.merged_shared_experts() && !c.mlp_bias) {
      g.gated_mlp("mlp.shared_experts.", H, n.mul(S, W), false, sk);
    } else if (S == 1) {
      g.gated_mlp(c.family == "qwen2_moe" ? "mlp.shared_expert." : "mlp.shared_experts.", H, W,
                  c.mlp_bias, sk);
    } else {
      for (std::int64_t s = 0; s < S; ++s)
        g.gated_mlp("mlp.shared_experts." + std::to_string(s) + ".", H, W, c.mlp_bias, sk);
    }
    if (c.shared_expert_gate) g.add("mlp.shared_expert_gate.weight", {1, H}, sk);

    // Routed experts: one expert's templates.
    const std::int64_t F = c.moe_intermediate_size;
    Group x(expert_, n);
    const TensorKind ek = TensorKind::expert;
    if (mixtral) {
      experts_prefix_ = "block_sparse_moe.experts.";
      x.gated_mlp("", H, F, c.mlp_bias, ek, "w1", "w3", "w2");
    } else if (gpt_oss && layout == TableLayout::trainer) {
      // The trainer's packed row per expert (train/gpt_oss_experts.h).
      experts_prefix_ = "mlp.experts.";
      x.add("gate_proj.weight", {F, H}, ek);
      x.add("up_proj.weight", {F, H}, ek);
      x.add("down_proj.weight", {H, F}, ek);
      if (c.mlp_bias) {
        x.add("gate_proj.bias", {F}, ek);
        x.add("up_proj.bias", {F}, ek);
        x.add("down_proj.bias", {H}, ek);
      }
    } else if (gpt_oss) {
      // GptOssExperts: gate and up interleaved in one [H, 2F] matrix per expert,
      // stored as parameters (not Linear), so in x out orientation.
      experts_prefix_ = "mlp.experts.";
      fused_experts_ = true;
      x.add("gate_up_proj", {H, n.mul(2, F)}, ek);
      if (c.mlp_bias) x.add("gate_up_proj_bias", {n.mul(2, F)}, ek);
      x.add("down_proj", {F, H}, ek);
      if (c.mlp_bias) x.add("down_proj_bias", {H}, ek);
    } else {
      experts_prefix_ = "mlp.experts.";
      x.gated_mlp("", H, F, c.mlp_bias, ek);
    }
  }

  head_sum_ = sum_by_kind(head_, n);
  tail_sum_ = sum_by_kind(tail_, n);
  dense_sum_ = sum_by_kind(dense_layer_, n);
  moe_sum_ = sum_by_kind(moe_layer_, n);
  expert_sum_ = sum_by_kind(expert_, n);
  for (int k = 0; k < kNumTensorKinds; ++k) {
    std::int64_t t = n.add(head_sum_[k], tail_sum_[k]);
    t = n.add(t, n.mul(num_dense, dense_sum_[k]));
    t = n.add(t, n.mul(num_moe, moe_sum_[k]));
    t = n.add(t, n.mul(num_moe, n.mul(c.num_experts, expert_sum_[k])));
    total_[k] = t;
    total_all_ = n.add(total_all_, t);
  }
  const std::int64_t experts_per_layer =
      fused_experts_ ? static_cast<std::int64_t>(expert_.size())
                     : n.mul(c.num_experts, static_cast<std::int64_t>(expert_.size()));
  size_ = static_cast<std::int64_t>(head_.size() + tail_.size());
  size_ = n.add(size_, n.mul(num_dense, static_cast<std::int64_t>(dense_layer_.size())));
  size_ = n.add(size_, n.mul(num_moe, n.add(static_cast<std::int64_t>(moe_layer_.size()),
                                            experts_per_layer)));
}

void TensorTable::for_each(const std::function<void(const TensorEntry&)>& fn) const {
  TensorEntry e;
  auto emit = [&](const TensorTemplate& t, std::string name, std::int64_t layer, std::int64_t expert) {
    e.name = std::move(name);
    e.shape = t.shape;
    e.kind = t.kind;
    e.layer = layer;
    e.expert = expert;
    e.expert_sharded = t.kind == TensorKind::expert;
    e.vocab_sharded = t.kind == TensorKind::embedding || t.kind == TensorKind::head;
    fn(e);
  };
  for (const TensorTemplate& t : head_) emit(t, t.name, -1, -1);
  for (std::int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const bool moe = config_.is_moe_layer(i);
    for (const TensorTemplate& t : moe ? moe_layer_ : dense_layer_) emit(t, prefix + t.name, i, -1);
    if (!moe) continue;
    if (fused_experts_) {
      for (const TensorTemplate& t : expert_) {
        TensorTemplate f = t;
        f.shape.insert(f.shape.begin(), config_.num_experts);
        emit(f, prefix + experts_prefix_ + t.name, i, -1);
      }
      continue;
    }
    for (std::int64_t x = 0; x < config_.num_experts; ++x) {
      const std::string xp = prefix + experts_prefix_ + std::to_string(x) + ".";
      for (const TensorTemplate& t : expert_) emit(t, xp + t.name, i, x);
    }
  }
  for (const TensorTemplate& t : tail_) emit(t, t.name, -1, -1);
}

std::vector<TensorEntry> TensorTable::entries() const {
  std::vector<TensorEntry> out;
  out.reserve(static_cast<std::size_t>(size_));
  for_each([&](const TensorEntry& e) { out.push_back(e); });
  return out;
}

}  // namespace peakbound
