#include "peakbound/train/moe_transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/memory_timeline.h"
#include "peakbound/core/splitmix.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/layers/decoder_layer.h"
#include "peakbound/layers/moe_layer.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/embedding.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/ops/moe_permute.h"
#include "peakbound/ops/moe_router.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/schedules/checkpoint_offload.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/hf_checkpoint.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;

// The tokens Ring-DTP scores (ModelSchedules::ring_dtp): a token whose target is
// ignore_index has a zero loss gradient, so its logits feed nothing. Its row of the normed
// hidden is left out of the vocabulary projection: the scored rows move to the front in
// order (with their targets), the loss runs over them alone, and their gradient rows go
// back to their positions after it, zeros in the others. Every row's logits, loss and dX
// are what they were; the head's gradient sums over the same tokens in blocks of scored
// tokens (another grouping of its fp32 sums). The rows move in place on the device, a run
// of consecutive rows at a time, in pieces no longer than the distance it moves (so no
// copy overlaps itself): compacting, a run goes to positions at or before its own and
// after the runs already moved; expanding, the runs in reverse, each goes back above
// every packed run not yet moved.
struct ScoredRuns {
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // (first token, tokens), in order
  std::vector<std::int32_t> targets;                        // theirs, packed
  std::int64_t count() const { return static_cast<std::int64_t>(targets.size()); }  // scored tokens
};

ScoredRuns scored_runs(const std::int32_t* targets, std::int64_t tokens, std::int32_t ignore_index) {
  ScoredRuns r;
  for (std::int64_t t = 0; t < tokens;) {
    if (targets[t] == ignore_index) {
      ++t;
      continue;
    }
    const std::int64_t first = t;
    while (t < tokens && targets[t] != ignore_index) r.targets.push_back(targets[t++]);
    r.runs.emplace_back(first, t - first);
  }
  return r;
}

// Rows [from, from + n) to [to, to + n) of one buffer, in pieces that do not overlap.
void move_rows(Device& dev, Stream& s, unsigned char* base, std::size_t row_bytes, std::int64_t from, std::int64_t to,
               std::int64_t n) {
  if (from == to || n == 0) return;
  const std::int64_t step = std::abs(from - to);
  const auto piece = [&](std::int64_t i, std::int64_t m) {
    dev.memcpy_async(base + static_cast<std::size_t>(to + i) * row_bytes,
                     base + static_cast<std::size_t>(from + i) * row_bytes, static_cast<std::size_t>(m) * row_bytes,
                     CopyKind::device_to_device, s);
  };
  if (to < from)
    for (std::int64_t i = 0; i < n; i += step) piece(i, std::min(step, n - i));
  else
    for (std::int64_t i = n; i > 0; i -= step) piece(std::max<std::int64_t>(i - step, 0), std::min(step, i));
}

void compact_scored(Device& dev, Stream& s, void* rows, std::size_t row_bytes, const ScoredRuns& r) {
  std::int64_t to = 0;
  for (const auto& [first, n] : r.runs) {
    move_rows(dev, s, static_cast<unsigned char*>(rows), row_bytes, first, to, n);
    to += n;
  }
}

template <class A>
void expand_scored(Device& dev, Stream& s, A* rows, std::int64_t width, std::int64_t tokens, const ScoredRuns& r) {
  const std::size_t row_bytes = static_cast<std::size_t>(width) * sizeof(A);
  std::int64_t from = r.count();
  for (auto it = r.runs.rbegin(); it != r.runs.rend(); ++it) {
    from -= it->second;
    move_rows(dev, s, reinterpret_cast<unsigned char*>(rows), row_bytes, from, it->first, it->second);
  }
  std::int64_t next = 0;  // the unscored rows' gradient is zero
  for (const auto& [first, n] : r.runs) {
    if (first > next) ops::fill(dev, s, rows + next * width, (first - next) * width, 0.0f);
    next = first + n;
  }
  if (tokens > next) ops::fill(dev, s, rows + next * width, (tokens - next) * width, 0.0f);
}

void unsupported(const ModelConfig& c, const std::string& what) {
  throw InvalidArgument("model '" + c.name + "': " + what + " is not implemented by the trainer yet");
}

u64 fnv1a(const std::string& s) {
  u64 h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Element i of a N(0, 1) stream keyed by k (Box-Muller on two 53-bit uniforms in (0, 1]).
double normal_at(u64 k, u64 i) {
  const double u1 = (static_cast<double>(splitmix64(k + 2 * i) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(splitmix64(k + 2 * i + 1) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

bool is_norm_weight(const TensorEntry& e) {
  // input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm.
  const std::string& n = e.name;
  const std::string suffix = "norm.weight";
  return e.shape.size() == 1 && n.size() >= suffix.size() &&
         n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_bias(const TensorEntry& e) {
  const std::string& n = e.name;
  return n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
}

// Element i (of the whole tensor) of v's initial value under seed, initializer std sd:
// RMSNorm weights 1 and Linear biases 0 (as transformers' _init_weights), the rest
// N(0, sd^2) (gpt-oss's sinks too).
float init_value(u64 seed, double sd, const ParameterView& v, u64 i) {
  if (is_norm_weight(v.entry)) return 1.0f;
  if (is_bias(v.entry)) return 0.0f;
  return static_cast<float>(sd * normal_at(splitmix64(seed ^ splitmix64(fnv1a(v.name()))), i));
}

// dst (device, bf16) [n] = to_bf16(src) (host fp32 [n]); waits for the copy.
void upload_bf16(Device& dev, void* dst, const std::vector<float>& src) {
  std::vector<bf16> h(src.size());
  ops::host_to_bf16(h.data(), src.data(), static_cast<std::int64_t>(src.size()));
  dev.memcpy_async(dst, h.data(), h.size() * sizeof(bf16), CopyKind::host_to_device, dev.copy_stream());
  dev.synchronize(dev.copy_stream());
}

Shape shape_of(const std::vector<std::int64_t>& d) {
  switch (d.size()) {
    case 1: return Shape{d[0]};
    case 2: return Shape{d[0], d[1]};
    case 3: return Shape{d[0], d[1], d[2]};
    default: throw InternalError("moe transformer: unexpected tensor rank " + std::to_string(d.size()));
  }
}

}  // namespace

void check_trainable(const ModelConfig& c) {
  c.validate();
  // A config.json setting that changes the computed model (activation, RoPE scaling...).
  if (!c.unmodelled.empty())
    throw InvalidArgument("model '" + c.name + "': config.json sets " + c.unmodelled.front() +
                          "; refusing to train a different model than the config describes");
  if (c.attention == AttentionKind::mla && c.family == "deepseek_v2")
    unsupported(c, "DeepSeek-V2's attention (MLA is checked against DeepSeek-V3's)");
  // DeepSeek-V3's sigmoid router trains without transformers' aux loss (its balance comes
  // from the correction bias's update, MoeTransformer::update_router_bias).
  if (c.router_scoring == RouterScoring::sigmoid && c.router_aux_loss_coef > 0)
    unsupported(c, "the load-balancing aux loss with sigmoid router scoring");
  if (c.seq_aux_loss_coef > 0 && c.router_scoring != RouterScoring::sigmoid)
    unsupported(c, "the sequence-wise balance loss (--seq-aux-coef) with softmax router scoring");
  if (c.router_score_correction && c.router_scoring != RouterScoring::sigmoid)
    unsupported(c, "a router score correction with softmax scoring");
  // gpt-oss's router and expert biases are modelled (its MoE layer); nobody else's.
  if ((c.router_bias || c.mlp_bias) && c.family != "gpt_oss") unsupported(c, "router or MLP biases");
  if (c.tie_word_embeddings) unsupported(c, "tied embeddings");
  if (c.num_shared_experts > 1 && !c.merged_shared_experts())
    unsupported(c, "more than one separately stored shared expert");
  if (c.num_experts == 0 && c.num_layers == 0) unsupported(c, "a model without layers");
}

void check_model_schedules(const ModelSchedules& s) {
  validate_checkpoint_options(s.checkpoint);
  if (s.keep_attention && s.checkpoint.group_layers > 1)
    throw InvalidArgument("keep_attention (--keep-attention) does not combine with checkpoint groups of " +
                          std::to_string(s.checkpoint.group_layers) +
                          " layers: a group's recomputation runs its layers' attention again, so nothing kept "
                          "from the forward would be read; choose one");
  if (s.embedding_rows < 1)
    throw InvalidArgument("embedding_rows must be >= 1, got " + std::to_string(s.embedding_rows));
}

StoreGroups StoreGroups::of(const ParallelLayout& layout, int world, int rank) {
  validate_layout(layout, world);
  if (rank < 0 || rank >= world)
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside the " + std::to_string(world) + " ranks");
  const int ep = static_cast<int>(layout.ep), vg = static_cast<int>(layout.vocab);
  StoreGroups g;
  g.world = world;
  g.ep = ep;
  g.ep_rank = rank % ep;
  g.ep_replicas = world / ep;
  g.vocab = vg;
  g.vocab_rank = rank % vg;
  g.vocab_replicas = world / vg;
  return g;
}

ModelStoreSpecs model_store_specs(const ModelConfig& c, const StoreGroups& g, bool vocab_parallel_embedding) {
  const std::int64_t E = c.num_experts, ep = g.ep, ep_rank = g.ep_rank;
  if (E > 0 && E % ep != 0)
    throw InvalidArgument("--ep " + std::to_string(ep) + " must divide the model's " + std::to_string(E) + " experts");
  const std::int64_t per = E > 0 ? E / ep : 0;
  const VocabShard shard = vocab_shard(c.vocab_size, g.vocab, g.vocab_rank);
  auto multiple = [](int group_size) { return kViewAlignElements * static_cast<u64>(group_size); };
  ModelStoreSpecs s;
  s.experts.select = [per, ep_rank](const TensorEntry& e) -> std::optional<RowRange> {
    if (e.kind != TensorKind::expert || e.expert / per != ep_rank) return std::nullopt;
    return RowRange{0, e.shape[0]};
  };
  s.experts.options = LayoutOptions{1, multiple(g.ep_replicas)};
  s.head.select = [shard, vocab_parallel_embedding](const TensorEntry& e) -> std::optional<RowRange> {
    if (e.kind != TensorKind::head && !(vocab_parallel_embedding && e.kind == TensorKind::embedding))
      return std::nullopt;
    return RowRange{shard.offset, shard.offset + shard.rows};
  };
  s.head.options = LayoutOptions{kViewAlignElements, multiple(g.vocab_replicas)};
  return s;
}

AttentionLayerConfig model_attention_config(const ModelConfig& c, std::int64_t S, int cp, int cp_rank,
                                            std::int64_t piece_tokens) {
  AttentionLayerConfig ac;
  ac.piece_tokens = piece_tokens;
  ac.hidden = c.hidden_size;
  ac.q_heads = c.num_heads;
  ac.kv_heads = c.num_kv_heads;
  ac.head_dim = c.head_dim;
  ac.rope_theta = c.rope_theta;
  ac.rope_scaling = c.rope_scaling;
  ac.rms_eps = static_cast<float>(c.rms_norm_eps);
  ac.qk_norm = c.qk_norm;
  ac.qkv_bias = c.attention_qkv_bias;
  ac.out_bias = c.attention_out_bias;
  ac.sinks = c.attention_sinks;
  if (c.attention == AttentionKind::mla) {
    ac.mla = true;
    ac.head_dim = 0;
    ac.q_lora_rank = c.q_lora_rank;
    ac.kv_lora_rank = c.kv_lora_rank;
    ac.qk_nope_dim = c.qk_nope_head_dim;
    ac.qk_rope_dim = c.qk_rope_head_dim;
    ac.v_dim = c.v_head_dim;
    ac.rope_interleave = c.rope_interleave;
    ac.mla_latent_ring = c.mla_latent_ring;
    // transformers: self.scaling = yarn_apply_mscale(qk_head_dim ** -0.5), in double.
    ac.softmax_scale =
        static_cast<float>(std::pow(static_cast<double>(c.qk_head_dim()), -0.5) * c.attention_softmax_factor);
  }
  ac.seq_len = S;
  ac.cp = cp;
  ac.cp_rank = cp_rank;
  ac.context_attention = c.ulysses_attention ? ContextAttention::ulysses : ContextAttention::ring;
  return ac;
}

std::int64_t embedding_round_rows(std::int64_t most, std::int64_t embedding_rows) {
  if (most < 0 || embedding_rows < 1)
    throw InvalidArgument("embedding rounds: need tokens >= 0 and embedding_rows >= 1 (got " +
                          std::to_string(embedding_rows) + ")");
  return std::min(most, embedding_rows);
}

ModelEmbeddingBuffers model_embedding_buffers(std::int64_t rows, int group, std::int64_t hidden, Precision p) {
  if (rows < 0 || group < 1 || hidden < 1)
    throw InvalidArgument("embedding buffers: need rows >= 0, a group of >= 1 and hidden >= 1");
  const u64 r = static_cast<u64>(rows), all = checked_mul(r, static_cast<u64>(group), "[P rows]");
  const u64 a = dtype_size(activation_dtype(p));
  ModelEmbeddingBuffers b;
  b.ids = buffer_spec(Component::vocab, r, sizeof(std::int32_t));
  b.order = buffer_spec(Component::vocab, r, sizeof(std::int64_t));
  b.recv_ids = buffer_spec(Component::vocab, all, sizeof(std::int32_t));
  b.rows_out = buffer_spec(Component::vocab, checked_mul(all, static_cast<u64>(hidden), "[P rows, H]"), a);
  b.rows_in = buffer_spec(Component::vocab, checked_mul(r, static_cast<u64>(hidden), "[rows, H]"), a);
  return b;
}

ModelAuxBuffers model_aux_buffers(std::int64_t experts) {
  if (experts < 0) throw InvalidArgument("model aux buffers: experts must be >= 0");
  const u64 e = static_cast<u64>(std::max<std::int64_t>(experts, 1));
  ModelAuxBuffers b;
  b.counts = b.prob_sums = b.aux_grad = buffer_spec(Component::workspace, e, sizeof(float));
  b.loss = buffer_spec(Component::workspace, 2, sizeof(float));  // the aux loss, the sequence-wise balance loss
  return b;
}

ModelRouterStateBuffers model_router_state_buffers(const ModelConfig& c) {
  const u64 M = c.router_score_correction && c.num_experts > 0 ? static_cast<u64>(c.num_moe_layers()) : 0;
  const u64 n = checked_mul(M, static_cast<u64>(std::max<std::int64_t>(c.num_experts, 0)), "router state [M, E]");
  return {buffer_spec(Component::params, n, 4), buffer_spec(Component::workspace, n, 4)};
}

std::int64_t seq_aux_floats(const ModelConfig& c, std::int64_t sequences) {
  if (!(c.seq_aux_loss_coef > 0) || c.num_experts <= 0 || sequences <= 0) return 0;
  return static_cast<std::int64_t>(checked_mul(
      checked_mul(static_cast<u64>(c.num_moe_layers()), static_cast<u64>(sequences), "[M, B]"),
      static_cast<u64>(c.num_experts), "[M, B, E]"));
}

ModelBatchBuffers model_batch_buffers(std::int64_t tokens, std::int64_t hidden, Precision precision,
                                      std::int64_t seq_floats) {
  if (tokens < 0 || hidden < 1 || seq_floats < 0)
    throw InvalidArgument("model batch buffers: tokens must be >= 0, hidden >= 1 and the balance statistics >= 0");
  const u64 t = static_cast<u64>(tokens);
  const u64 th = checked_mul(t, static_cast<u64>(hidden), "[T, H]");
  ModelBatchBuffers b;
  b.ids = b.targets = buffer_spec(Component::workspace, t, sizeof(std::int32_t));
  b.x = b.y = b.d_hn = buffer_spec(Component::layer, th, dtype_size(activation_dtype(precision)));
  b.rstd = buffer_spec(Component::layer, t, sizeof(float));
  b.seq_counts = b.seq_psum = buffer_spec(Component::workspace, static_cast<u64>(seq_floats), sizeof(float));
  b.y_host = buffer_spec(Component::checkpoints, th, dtype_size(activation_dtype(precision)));
  b.norm_tile = buffer_spec(
      Component::layer,
      checked_mul(static_cast<u64>(std::min(tokens, kFinalNormTileRows)), static_cast<u64>(hidden), "[tile, H]"),
      dtype_size(activation_dtype(precision)));
  return b;
}

// One decoder layer: its two sublayers and the block the stack runs.
struct MoeTransformer::Layer {
  std::unique_ptr<AttentionLayer> attention;
  std::unique_ptr<MoeLayer> mlp;
  std::unique_ptr<DecoderLayer> block;
  std::unique_ptr<Block> fsdp;  // the block the stack runs: block under FSDP
};

// One micro-batch's device state.
struct MoeTransformer::Pass {
  std::int64_t T = 0, S = 0, world_tokens = 0;
  std::int64_t sequences = 0, world_sequences = 0;  // this rank's; the world's distinct ones
  Buffer ids, targets, seq_counts, seq_psum, x;
  ScoredRuns scored;  // the tokens the loss scores (Ring-DTP), from prepare
};

Tensor MoeTransformer::view(ParameterStore& s, const std::string& name, bool grad) const {
  const ParameterView& v = s.view(name);
  if (grad) return Tensor(s.grad(v), shape_of(v.shape), DType::f32, Location::device);
  return Tensor(s.param_raw(v), shape_of(v.shape), s.param_dtype(), Location::device);
}

// A layer's non-expert tensor: a view into the gathered slot the layer always uses.
Tensor MoeTransformer::slot_view(std::int64_t layer, const std::string& name, bool grad) const {
  const auto [unit, v] = fsdp_->find(name);
  if (unit != FsdpUnits::layer(layer)) throw InternalError("moe transformer: " + name + " is not in its layer's unit");
  const Buffer& slot = grad ? grad_slots_[layer % 2] : param_slots_[layer % 2];
  const DType t = grad ? DType::f32 : fsdp_->param_dtype();  // gradients are f32 in both precisions
  return Tensor(slot.as<std::byte>() + v->offset * dtype_size(t), shape_of(v->shape), t, Location::device);
}

// A decoder layer under FSDP: its unit is gathered into its slot before forward and
// backward, and after backward its full gradient is reduce-scattered into the shard. The
// next block's gather is started as soon as this one's has landed, into the other slot
// (which the previous block has finished with): forward layer l + 1; in backward the block
// the stack computes next (checkpoint_backward_next: l - 1, or with checkpoint groups the
// group's next recomputation or the previous group's first block). Layer l's views are in
// slot l % 2, so where that next block uses the same slot as this one (a group of an even
// count before this one's first block) its gather waits for its call. This layer's
// reduce-scatter runs while the next layer's backward does (FsdpUnits).
class MoeTransformer::FsdpBlock final : public Block {
 public:
  FsdpBlock(MoeTransformer& m, std::int64_t layer, Block& inner) : m_(m), l_(layer), inner_(inner) {}
  void forward(const Tensor& x, const Tensor& y) override {
    mark_phase(m_.dev_.arena(), "forward layer", l_);  // the memory timeline's phase
    gather_then_prefetch(l_ + 1 < layers() ? l_ + 1 : -1);
    inner_.forward(x, y);
  }
  // A checkpoint group's recomputation in the stack's backward.
  void forward_recompute(const Tensor& x, const Tensor& y) override {
    mark_phase(m_.dev_.arena(), "recompute layer", l_);
    gather_then_prefetch(checkpoint_backward_next(layers(), group_layers(), {l_, true}));
    inner_.forward_recompute(x, y);
  }
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override {
    mark_phase(m_.dev_.arena(), "backward layer", l_);  // with the layer's recomputation
    const std::size_t u = FsdpUnits::layer(l_);
    float* grads = m_.grad_slots_[l_ % 2].as<float>();
    gather_then_prefetch(checkpoint_backward_next(layers(), group_layers(), {l_, false}));
    ops::fill(m_.dev_, m_.dev_.compute_stream(), grads, static_cast<std::int64_t>(m_.fsdp_->layout(u).elements), 0.0f);
    inner_.backward(x, dy, dx);
    m_.fsdp_->reduce_add_async(u, grads);  // completed by the next layer's, or the embedding's reduce_add
  }
  bool backward_in_place() const override { return inner_.backward_in_place(); }
  bool forward_in_place() const override { return inner_.forward_in_place(); }
  std::vector<Parameter> parameters() const override { return inner_.parameters(); }
  void zero_grad() override { inner_.zero_grad(); }

 private:
  std::int64_t layers() const { return static_cast<std::int64_t>(m_.layers_.size()); }
  std::int64_t group_layers() const { return m_.schedules_.checkpoint.group_layers; }
  // This layer's unit into its slot, then the gather of block `next` (-1: none) started
  // where its slot is the other one.
  void gather_then_prefetch(std::int64_t next) {
    m_.fsdp_->gather(FsdpUnits::layer(l_), m_.param_slots_[l_ % 2].data());
    if (next >= 0 && next % 2 != l_ % 2)
      m_.fsdp_->prefetch(FsdpUnits::layer(next), m_.param_slots_[next % 2].data());
  }

  MoeTransformer& m_;
  std::int64_t l_;
  Block& inner_;
};

MoeTransformer::MoeTransformer(Device& dev, HostMemory& host, ProcessGroups& groups, const ModelConfig& config,
                               const ModelSchedules& schedules)
    : dev_(dev), host_(host), groups_(groups), config_(config), table_(config, TableLayout::trainer), schedules_(schedules),
      out_host_(host) {
  check_trainable(config_);
  check_model_schedules(schedules_);
  const ModelConfig& c = config_;
  if (dev.backend() != Backend::cpu && (c.attention_qkv_bias || c.attention_out_bias || c.attention_sinks ||
                                       c.router_bias || c.mlp_bias || c.swiglu_limit > 0.0 ||
                                       c.router_scoring == RouterScoring::sigmoid || c.attention == AttentionKind::mla))
    throw Unavailable("model '" + c.name + "': attention biases and sinks, router and expert biases, the clamped " +
                      "SwiGLU, the sigmoid router and MLA have CPU kernels only so far; train it with --device cpu");
  const std::int64_t H = c.hidden_size, E = c.num_experts;
  const std::int64_t ep = groups_.ep->size(), ep_rank = groups_.ep->rank();
  if (E > 0 && E % ep != 0)
    throw InvalidArgument("--ep " + std::to_string(ep) + " must divide the model's " + std::to_string(E) + " experts");
  const std::int64_t per = E > 0 ? E / ep : 0;

  StoreGroups sg;
  sg.world = groups_.world->size();
  sg.ep = groups_.ep->size();
  sg.ep_rank = groups_.ep->rank();
  sg.ep_replicas = groups_.ep_replicas->size();
  sg.vocab = groups_.vocab->size();
  sg.vocab_rank = groups_.vocab->rank();
  sg.vocab_replicas = groups_.vocab_replicas->size();
  if (schedules_.vocab_parallel_embedding && dev.backend() != Backend::cpu)
    throw Unavailable("the vocabulary-parallel embedding runs on the CPU device only so far; train it with --device cpu");
  if (c.ulysses_attention && groups_.cp->size() > 1 && dev.backend() != Backend::cpu)
    throw Unavailable("Ulysses attention runs on the CPU device only so far; train it with --device cpu or use the ring");
  store_specs_ = model_store_specs(c, sg, schedules_.vocab_parallel_embedding);
  const ModelStoreSpecs& specs = store_specs_;
  const Precision prec = schedules_.precision;
  schedules_.vocab.precision = prec;  // the model's precision rules the head's
  // The FSDP shard buffers carry the trainer's slices of the two stores after the units'
  // shard (each store / its group's size, in stores() order: FsdpUnits' tail): the
  // optimizer updates them all in place. A store whose group is one rank is its own
  // slice: it lives in that tail (no second copy of it, and no copy between the two each
  // step: the trainer neither reduce-scatters nor gathers it).
  const StoreSpec* store_spec[2] = {&specs.experts, &specs.head};
  const std::vector<Communicator*> store_group = store_groups();
  ParameterLayout layout[2];
  std::uint64_t slice[2] = {0, 0};  // this rank's elements of each store in the tail
  for (std::size_t k = 0; k < 2; ++k) {
    layout[k] = parameter_layout(table_, store_spec[k]->select, store_spec[k]->options);
    slice[k] = layout[k].elements / static_cast<std::uint64_t>(store_group[k]->size());
  }
  fsdp_ = std::make_unique<FsdpUnits>(dev, table_, *groups_.world, prec, slice[0] + slice[1],
                                      schedules_.fsdp_reduce_thread, !schedules_.vocab_parallel_embedding);
  std::uint64_t at = fsdp_->shard_elements();
  for (std::size_t k = 0; k < 2; ++k) {
    StoreMemory in_tail;
    if (store_group[k]->size() == 1) {
      in_tail.params = static_cast<std::byte*>(fsdp_->params_shard_raw()) + at * dtype_size(param_dtype(prec));
      in_tail.grads = fsdp_->grads_shard() + at;
    }
    (k ? head_ : experts_) = std::make_unique<ParameterStore>(dev, table_, std::move(layout[k]), prec, in_tail);
    at += slice[k];
  }
  const FsdpBuffers& fb = fsdp_->buffers();
  for (int k = 0; k < 2; ++k) {
    param_slots_[k] = dev.allocate(fb.layer_params.component, fb.layer_params.bytes);
    grad_slots_[k] = dev.allocate(fb.layer_grads.component, fb.layer_grads.bytes);
  }

  // The aux-loss state shared by every MoE layer.
  const ModelAuxBuffers ab = model_aux_buffers(E);
  counts_ = dev.allocate(ab.counts.component, ab.counts.bytes);
  prob_sums_ = dev.allocate(ab.prob_sums.component, ab.prob_sums.bytes);
  aux_grad_ = dev.allocate(ab.aux_grad.component, ab.aux_grad.bytes);
  aux_loss_ = dev.allocate(ab.loss.component, ab.loss.bytes);
  aux_state_ = std::make_unique<MoeAuxState>(MoeAuxState{
      counts_.as<float>(), prob_sums_.as<float>(), c.router_aux_loss_coef > 0 ? aux_grad_.as<float>() : nullptr});
  // DeepSeek-V3's correction biases (zero until loaded) and their loads.
  const ModelRouterStateBuffers rb = model_router_state_buffers(c);
  correction_ = dev.allocate(rb.correction.component, rb.correction.bytes);
  loads_ = dev.allocate(rb.loads.component, rb.loads.bytes);
  if (rb.correction.bytes > 0) {
    ops::fill(dev, dev.compute_stream(), correction_.as<float>(), static_cast<std::int64_t>(rb.correction.bytes / 4),
              0.0f);
    ops::fill(dev, dev.compute_stream(), loads_.as<float>(), static_cast<std::int64_t>(rb.loads.bytes / 4), 0.0f);
  }

  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto layer = std::make_unique<Layer>();
    AttentionLayerConfig ac =
        model_attention_config(c, 0, groups_.cp->size(), groups_.cp->rank(), schedules_.attention_piece);
    ac.precision = prec;
    ac.threads = schedules_.attention_threads;
    ac.window = c.attention_window(l);
    ac.output_rows = schedules_.moe_tile;  // the MLP's row tiles: its backward takes mid by them
    ac.output_on_host = offloads_attention_output(schedules_);
    AttentionLayerTensors at[2];
    for (int g = 0; g < 2 && ac.mla; ++g) {
      const std::string a = p + "self_attn.";
      at[g].w_in = slot_view(l, p + "input_layernorm.weight", g);
      if (c.q_lora_rank > 0) {
        at[g].wqa = slot_view(l, a + "q_a_proj.weight", g);
        if (c.attention_qkv_bias) at[g].bqa = slot_view(l, a + "q_a_proj.bias", g);
        at[g].q_a_norm = slot_view(l, a + "q_a_layernorm.weight", g);
        at[g].wqb = slot_view(l, a + "q_b_proj.weight", g);
      } else {
        at[g].wq = slot_view(l, a + "q_proj.weight", g);
      }
      at[g].wkva = slot_view(l, a + "kv_a_proj_with_mqa.weight", g);
      if (c.attention_qkv_bias) at[g].bkva = slot_view(l, a + "kv_a_proj_with_mqa.bias", g);
      at[g].kv_a_norm = slot_view(l, a + "kv_a_layernorm.weight", g);
      at[g].wkvb = slot_view(l, a + "kv_b_proj.weight", g);
      at[g].wo = slot_view(l, a + "o_proj.weight", g);
      if (c.attention_out_bias) at[g].bo = slot_view(l, a + "o_proj.bias", g);
    }
    for (int g = 0; g < 2 && !ac.mla; ++g) {
      at[g].w_in = slot_view(l, p + "input_layernorm.weight", g);
      at[g].wq = slot_view(l, p + "self_attn.q_proj.weight", g);
      at[g].wk = slot_view(l, p + "self_attn.k_proj.weight", g);
      at[g].wv = slot_view(l, p + "self_attn.v_proj.weight", g);
      at[g].wo = slot_view(l, p + "self_attn.o_proj.weight", g);
      if (c.qk_norm) {
        at[g].q_norm = slot_view(l, p + "self_attn.q_norm.weight", g);
        at[g].k_norm = slot_view(l, p + "self_attn.k_norm.weight", g);
      }
      if (c.attention_qkv_bias) {
        at[g].bq = slot_view(l, p + "self_attn.q_proj.bias", g);
        at[g].bk = slot_view(l, p + "self_attn.k_proj.bias", g);
        at[g].bv = slot_view(l, p + "self_attn.v_proj.bias", g);
      }
      if (c.attention_out_bias) at[g].bo = slot_view(l, p + "self_attn.o_proj.bias", g);
      if (c.attention_sinks) at[g].sinks = slot_view(l, p + "self_attn.sinks", g);
    }
    layer->attention = std::make_unique<AttentionLayer>(dev, ac, at[0], at[1]);
    if (ac.cp > 1) layer->attention->set_cp_group(groups_.cp.get());
    layer->attention->set_output_host(&out_host_);

    MoeLayerConfig mc =
        moe_layer_config(c, l, static_cast<float>(c.rms_norm_eps), schedules_.dispatch, schedules_.dispatch_options);
    mc.precision = prec;
    mc.seq_tile = schedules_.moe_tile;
    mc.moe_index = moe_layers_;  // the MoE layers before this one
    MoeLayerTensors mt[2];
    const bool moe = c.is_moe_layer(l);
    for (int g = 0; g < 2; ++g) mt[g].w_post = slot_view(l, p + "post_attention_layernorm.weight", g);
    if (moe) {
      ++moe_layers_;
      const bool mixtral = c.family == "mixtral", gpt_oss = c.family == "gpt_oss";
      const std::string router = p + (mixtral ? "block_sparse_moe.gate." : gpt_oss ? "mlp.router." : "mlp.gate.");
      const std::string gate = router + "weight";
      // This rank's first expert of the layer: its experts are packed from there.
      const std::string first = p + table_.experts_prefix() + std::to_string(ep_rank * per) + "." +
                                (mixtral ? "w1.weight" : "gate_proj.weight");
      const std::int64_t F = c.moe_intermediate_size;
      const std::int64_t expert_floats = moe_layer_dispatch_shape(mc).expert_floats();
      // The packed store puts each expert's gate, up, down back to back (gpt-oss: then its
      // three biases), experts in order.
      const char* names[6] = {mixtral ? "w1.weight" : "gate_proj.weight", mixtral ? "w3.weight" : "up_proj.weight",
                              mixtral ? "w2.weight" : "down_proj.weight", "gate_proj.bias", "up_proj.bias",
                              "down_proj.bias"};
      const std::int64_t at[6] = {0, F * H, 2 * F * H, 3 * F * H, 3 * F * H + F, 3 * F * H + 2 * F};
      const int pieces = mc.expert_bias ? 6 : 3;
      const std::uint64_t origin = experts_->view(first).offset;
      for (std::int64_t i = 0; i < per; ++i)
        for (int k = 0; k < pieces; ++k) {
          const std::string n =
              p + table_.experts_prefix() + std::to_string(ep_rank * per + i) + "." + names[k];
          const u64 want = origin + static_cast<u64>(i * expert_floats + at[k]);
          if (experts_->view(n).offset != want)
            throw InternalError("moe transformer: expert tensor " + n + " is not where MoeDispatch reads it");
        }
      if (mc.score_correction) {  // the f32 buffers, in the parameter views only
        const std::int64_t row = (moe_layers_ - 1) * E;
        mt[0].correction = Tensor(correction_.as<float>() + row, Shape{E}, DType::f32, Location::device);
        mt[0].loads = Tensor(loads_.as<float>() + row, Shape{E}, DType::f32, Location::device);
        router_buffer_names_.push_back(router + "e_score_correction_bias");
      }
      for (int g = 0; g < 2; ++g) {
        mt[g].w_gate = slot_view(l, gate, g);
        if (mc.router_bias) mt[g].w_gate_bias = slot_view(l, router + "bias", g);
        void* base = g ? static_cast<void*>(experts_->grad(first)) : experts_->param_raw(first);
        mt[g].experts = Tensor(base, Shape{per, expert_floats}, g ? DType::f32 : experts_->param_dtype(),
                               Location::device);
      }
      if (c.num_shared_experts > 0) {
        const std::string sp = p + (c.family == "qwen2_moe" ? "mlp.shared_expert." : "mlp.shared_experts.");
        for (int g = 0; g < 2; ++g) {
          mt[g].shared_gate = slot_view(l, sp + "gate_proj.weight", g);
          mt[g].shared_up = slot_view(l, sp + "up_proj.weight", g);
          mt[g].shared_down = slot_view(l, sp + "down_proj.weight", g);
          if (c.shared_expert_gate) mt[g].shared_expert_gate = slot_view(l, p + "mlp.shared_expert_gate.weight", g);
        }
      }
    } else {
      for (int g = 0; g < 2; ++g) {
        mt[g].dense_gate = slot_view(l, p + "mlp.gate_proj.weight", g);
        mt[g].dense_up = slot_view(l, p + "mlp.up_proj.weight", g);
        mt[g].dense_down = slot_view(l, p + "mlp.down_proj.weight", g);
      }
    }
    layer->mlp = std::make_unique<MoeLayer>(dev, *groups_.ep, mc, mt[0], mt[1], aux_state_.get());
    layer->block = std::make_unique<DecoderLayer>(dev, H, *layer->attention, *layer->mlp);
    layer->fsdp = std::make_unique<FsdpBlock>(*this, l, *layer->block);
    layers_.push_back(std::move(layer));
  }

  const VocabDims dims{c.vocab_size, H};
  vocab_loss_ = schedules_.ring_dtp ? make_ring_dtp_vocab_loss(dev, *groups_.vocab, dims, schedules_.vocab)
                                    : make_materialized_vocab_loss(dev, *groups_.vocab, dims, schedules_.vocab);
}

MoeTransformer::~MoeTransformer() = default;

std::vector<const DispatchStats*> MoeTransformer::dispatch_stats() const {
  std::vector<const DispatchStats*> out;
  for (const auto& l : layers_)
    if (const DispatchStats* st = l->mlp->dispatch_stats()) out.push_back(st);
  return out;
}

void MoeTransformer::init_parameters(std::uint64_t seed) {
  if (schedules_.precision == Precision::bf16) return init_bf16(seed);
  const double sd = config_.initializer_range;
  // Element i of tensor v (of the full tensor) under this seed.
  auto value = [&](const ParameterView& v, u64 i) { return init_value(seed, sd, v, i); };
  std::vector<float> host;
  for (ParameterStore* s : stores()) {
    for (const ParameterView& v : *s) {
      const std::int64_t n = v.numel();
      std::int64_t row = 1;
      for (std::size_t d = 1; d < v.entry.shape.size(); ++d) row *= v.entry.shape[d];
      const u64 first = static_cast<u64>(v.rows.begin * row);
      host.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) host[static_cast<std::size_t>(i)] = value(v, first + static_cast<u64>(i));
      dev_.memcpy_async(s->param(v), host.data(), static_cast<u64>(n) * sizeof(float), CopyKind::host_to_device,
                        dev_.copy_stream());
      dev_.synchronize(dev_.copy_stream());
    }
  }
  // The sharded units: this rank's slice [r n/G, (r+1) n/G) of each unit's flat layout.
  const u64 r = static_cast<u64>(groups_.world->rank());
  for (std::size_t u = 0; u < fsdp_->size(); ++u) {
    const u64 len = fsdp_->shard_len(u), lo = r * len, hi = lo + len;
    host.assign(static_cast<std::size_t>(len), 0.0f);  // padding stays zero
    for (const ParameterView& v : fsdp_->layout(u).views) {
      const u64 b = std::max(lo, v.offset), e = std::min(hi, v.offset + static_cast<u64>(v.numel()));
      for (u64 k = b; k < e; ++k) host[static_cast<std::size_t>(k - lo)] = value(v, k - v.offset);
    }
    dev_.memcpy_async(fsdp_->params_shard() + fsdp_->shard_offset(u), host.data(), len * sizeof(float),
                      CopyKind::host_to_device, dev_.copy_stream());
    dev_.synchronize(dev_.copy_stream());
  }
}

// Under bf16: the same fp32 values as the f32 init, laid out as each params buffer
// (padding zero), kept as the pending masters; the device gets to_bf16 of them.
void MoeTransformer::init_bf16(std::uint64_t seed) {
  const double sd = config_.initializer_range;
  for (ParameterStore* s : stores()) {
    std::vector<float> master(static_cast<std::size_t>(s->elements()), 0.0f);
    for (const ParameterView& v : *s) {
      std::int64_t row = 1;
      for (std::size_t d = 1; d < v.entry.shape.size(); ++d) row *= v.entry.shape[d];
      const u64 first = static_cast<u64>(v.rows.begin * row);
      for (std::int64_t i = 0; i < v.numel(); ++i)
        master[v.offset + static_cast<u64>(i)] = init_value(seed, sd, v, first + static_cast<u64>(i));
    }
    upload_bf16(dev_, s->params_raw(), master);
    s->set_pending_master(std::move(master));
  }
  // This rank's slice [r n/G, (r+1) n/G) of each unit, at the unit's shard offset.
  const u64 r = static_cast<u64>(groups_.world->rank());
  std::vector<float> master(static_cast<std::size_t>(fsdp_->shard_elements()), 0.0f);
  for (std::size_t u = 0; u < fsdp_->size(); ++u) {
    const u64 len = fsdp_->shard_len(u), lo = r * len, hi = lo + len, at = fsdp_->shard_offset(u);
    for (const ParameterView& v : fsdp_->layout(u).views) {
      const u64 b = std::max(lo, v.offset), e = std::min(hi, v.offset + static_cast<u64>(v.numel()));
      for (u64 k = b; k < e; ++k) master[at + k - lo] = init_value(seed, sd, v, k - v.offset);
    }
  }
  upload_bf16(dev_, fsdp_->params_shard_raw(), master);
  fsdp_->set_pending_master(std::move(master));
}

// Under bf16: the checkpoint's values through for_each_hf_tensor into host fp32 vectors
// laid out as each params buffer (the pending masters), to_bf16 of them on the device.
void MoeTransformer::load_hf_bf16(const std::string& dir) {
  const StoreSpec* specs[2] = {&store_specs_.experts, &store_specs_.head};
  for (int k = 0; k < 2; ++k) {
    ParameterStore& st = k ? *head_ : *experts_;
    std::vector<float> master(static_cast<std::size_t>(st.elements()), 0.0f);
    for_each_hf_tensor(dir, table_, specs[k]->select, [&](const ParameterView& v, const float* x, u64 n) {
      const ParameterView& w = st.view(v.name());
      if (n != static_cast<u64>(w.numel())) throw InternalError("moe transformer: " + v.name() + " size mismatch");
      std::copy(x, x + n, master.begin() + static_cast<std::ptrdiff_t>(w.offset));
    });
    upload_bf16(dev_, st.params_raw(), master);
    st.set_pending_master(std::move(master));
  }
  std::vector<float> master = hf_fsdp_shard(dir);
  upload_bf16(dev_, fsdp_->params_shard_raw(), master);
  fsdp_->set_pending_master(std::move(master));
}

// Every unit's tensors in one pass, on the host; this rank keeps the part inside its slice
// of each, at the unit's shard offset (the params shard's layout, padding zero).
std::vector<float> MoeTransformer::hf_fsdp_shard(const std::string& dir) const {
  std::vector<ShardSelector> units;
  for (std::size_t u = 0; u < fsdp_->size(); ++u) units.push_back(fsdp_->unit_selector(table_, u));
  const ShardSelector any = [&units](const TensorEntry& e) -> std::optional<RowRange> {
    for (const ShardSelector& sel : units)
      if (auto rows = sel(e)) return rows;
    return std::nullopt;
  };
  const u64 r = static_cast<u64>(groups_.world->rank());
  std::vector<float> master(static_cast<std::size_t>(fsdp_->shard_elements()), 0.0f);
  for_each_hf_tensor(dir, table_, any, [&](const ParameterView& v, const float* x, u64 n) {
    const auto [u, w] = fsdp_->find(v.name());
    if (n != static_cast<u64>(w->numel())) throw InternalError("moe transformer: " + v.name() + " size mismatch");
    const u64 len = fsdp_->shard_len(u), lo = r * len, hi = lo + len;
    const u64 b = std::max(lo, w->offset), e = std::min(hi, w->offset + n);
    for (u64 i = b; i < e; ++i) master[fsdp_->shard_offset(u) + i - lo] = x[i - w->offset];
  });
  return master;
}

void MoeTransformer::load_hf(const std::string& dir) {
  // The router buffers, whole on every rank, f32 in both precisions.
  if (!router_buffer_names_.empty()) {
    std::vector<std::pair<std::string, float*>> dst = router_buffers();
    const ShardSelector buffers = [](const TensorEntry& e) -> std::optional<RowRange> {
      if (!is_router_buffer(e)) return std::nullopt;
      return RowRange{0, e.shape[0]};
    };
    for_each_hf_tensor(dir, table_, buffers, [&](const ParameterView& v, const float* x, u64 n) {
      auto it = std::find_if(dst.begin(), dst.end(), [&](const auto& d) { return d.first == v.name(); });
      if (it == dst.end() || n != static_cast<u64>(config_.num_experts))
        throw InternalError("moe transformer: router buffer " + v.name() + " has no place");
      dev_.memcpy_async(it->second, x, n * sizeof(float), CopyKind::host_to_device, dev_.copy_stream());
      dev_.synchronize(dev_.copy_stream());
    });
  }
  if (schedules_.precision == Precision::bf16) return load_hf_bf16(dir);
  for (ParameterStore* s : stores()) load_hf_weights(dir, *s);
  // The units' slices through the host, as under bf16: no unit is ever whole on the device
  // (a whole unit's store was a transient the footprint did not hold).
  const std::vector<float> shard = hf_fsdp_shard(dir);
  dev_.memcpy_async(fsdp_->params_shard(), shard.data(), shard.size() * sizeof(float), CopyKind::host_to_device,
                    dev_.copy_stream());
  dev_.synchronize(dev_.copy_stream());
}

std::vector<std::pair<std::string, float*>> MoeTransformer::router_buffers() {
  std::vector<std::pair<std::string, float*>> out;
  for (std::size_t m = 0; m < router_buffer_names_.size(); ++m)
    out.emplace_back(router_buffer_names_[m], correction_.as<float>() + static_cast<std::int64_t>(m) * config_.num_experts);
  return out;
}

void MoeTransformer::update_router_bias(float speed) {
  if (router_buffer_names_.empty()) return;
  if (!(speed >= 0.0f)) throw InvalidArgument("the router bias update speed must be >= 0");
  const std::int64_t E = config_.num_experts, M = static_cast<std::int64_t>(router_buffer_names_.size());
  Stream& s = dev_.compute_stream();
  dev_.synchronize();
  groups_.world->all_reduce(loads_.data(), static_cast<std::size_t>(M * E), DType::f32, ReduceOp::sum);
  if (speed > 0.0f)
    for (std::int64_t m = 0; m < M; ++m)
      ops::moe_router_bias_update(dev_, s, correction_.as<float>() + m * E, loads_.as<float>() + m * E, E, speed);
  ops::fill(dev_, s, loads_.as<float>(), M * E, 0.0f);
  dev_.synchronize();
}

void MoeTransformer::zero_grads() {
  for (ParameterStore* s : stores()) s->zero_grads();
  fsdp_->zero_grads();
}

void MoeTransformer::prepare(Pass& p, const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                             std::int64_t S) {
  if (sequences < 0 || S < 1)
    throw InvalidArgument("moe transformer: need sequences >= 0 and a sequence length >= 1");
  const std::int64_t V = config_.vocab_size, H = config_.hidden_size;
  p.S = S;
  // Every rank must agree that every id is valid before any collective runs.
  std::int64_t bad = -1;
  for (std::int64_t t = 0; t < sequences * S && bad < 0; ++t)
    if (ids[t] < 0 || ids[t] >= V) bad = ids[t];
  // Context parallel: this rank's zigzag shard of every sequence.
  const int cp = groups_.cp->size();
  std::vector<std::int32_t> local_ids, local_targets;
  bool differ = false;
  if (cp > 1) {
    if (S < 2 * cp)
      throw InvalidArgument("context parallel over " + std::to_string(cp) + " ranks needs sequences of at least " +
                            std::to_string(2 * cp) + " tokens, got " + std::to_string(S));
    differ = !same_sequences(ids, targets, sequences, S);
    const CpShard sh = zigzag_shard(S, cp, groups_.cp->rank());
    const std::int64_t n = sh.tokens();
    local_ids.resize(static_cast<std::size_t>(sequences * n));
    local_targets.resize(local_ids.size());
    for (std::int64_t b = 0; b < sequences; ++b)
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t from = b * S + sh.position(t), to = b * n + t;
        local_ids[static_cast<std::size_t>(to)] = ids[from];
        local_targets[static_cast<std::size_t>(to)] = targets[from];
      }
    ids = local_ids.data();
    targets = local_targets.data();
    p.T = sequences * n;
  } else {
    p.T = sequences * S;
  }
  std::int64_t flags[4] = {bad >= 0 ? 1 : 0, p.T, differ ? 1 : 0, sequences};
  groups_.world->all_reduce(flags, 4, DType::i64, ReduceOp::sum);
  p.sequences = sequences;
  p.world_sequences = flags[3] / cp;  // a context-parallel group's ranks hold the same sequences
  if (flags[0] != 0)
    throw InvalidArgument("input token id " + std::to_string(bad) + " is outside the vocabulary [0, " +
                          std::to_string(V) + ")" + (bad < 0 ? " (on another rank)" : ""));
  if (flags[2] != 0)
    throw InvalidArgument("the ranks of a context-parallel group must hold the same sequences (each takes its "
                          "zigzag shard of every one); some groups' differ");
  p.world_tokens = flags[1];
  const std::int64_t sf = seq_aux_floats(config_, p.T > 0 ? sequences : 0);
  const ModelBatchBuffers bb = model_batch_buffers(p.T, H, schedules_.precision, sf);
  const u64 tb = bb.ids.bytes;
  p.ids = dev_.allocate(bb.ids.component, bb.ids.bytes);
  p.targets = dev_.allocate(bb.targets.component, bb.targets.bytes);
  // The sequence-wise balance loss's statistics: each MoE layer's [sequences, E], zeroed.
  p.seq_counts = dev_.allocate(bb.seq_counts.component, bb.seq_counts.bytes);
  p.seq_psum = dev_.allocate(bb.seq_psum.component, bb.seq_psum.bytes);
  aux_state_->seq_counts = sf > 0 ? p.seq_counts.as<float>() : nullptr;
  aux_state_->seq_psum = sf > 0 ? p.seq_psum.as<float>() : nullptr;
  aux_state_->seq_stride = sf > 0 ? sequences * config_.num_experts : 0;
  aux_state_->seq_tokens = sf > 0 ? p.T / sequences : 0;
  aux_state_->seq_grad = false;
  seq_loss_ = 0.0;
  if (sf > 0) {
    ops::fill(dev_, dev_.compute_stream(), p.seq_counts.as<float>(), sf, 0.0f);
    ops::fill(dev_, dev_.compute_stream(), p.seq_psum.as<float>(), sf, 0.0f);
  }
  if (schedules_.ring_dtp) p.scored = scored_runs(targets, p.T, schedules_.vocab.ignore_index);
  Stream& cs = dev_.copy_stream();
  if (p.T > 0) {
    dev_.memcpy_async(p.ids.data(), ids, tb, CopyKind::host_to_device, cs);
    dev_.memcpy_async(p.targets.data(), targets, tb, CopyKind::host_to_device, cs);
  }
  dev_.synchronize(cs);
  for (auto& l : layers_) l->attention->set_seq_len(S);
  Stream& s = dev_.compute_stream();
  ops::fill(dev_, s, counts_.as<float>(), std::max<std::int64_t>(config_.num_experts, 1), 0.0f);
  ops::fill(dev_, s, prob_sums_.as<float>(), std::max<std::int64_t>(config_.num_experts, 1), 0.0f);
}

// The embedding, gathered for its forward only (its backward needs no weights): x = table[ids].
template <class A>
void MoeTransformer::embed(Pass& p, A* out) {
  if (schedules_.vocab_parallel_embedding) return embed_exchange<A>(p, out, nullptr, false);
  const std::int64_t V = config_.vocab_size, H = config_.hidden_size;
  Stream& s = dev_.compute_stream();
  const BufferSpec& es = fsdp_->buffers().embed_params;
  Buffer table = dev_.allocate(es.component, es.bytes);
  fsdp_->gather(FsdpUnits::embed(), table.data());
  const A* w = table.as<A>() + fsdp_->find("model.embed_tokens.weight").second->offset;
  if (p.T > 0) ops::embedding_forward(dev_, s, out, p.ids.as<std::int32_t>(), w, p.T, H, 0, V);
  dev_.synchronize(s);
}

template <class A>
void MoeTransformer::embed_exchange(Pass& p, A* out, const A* dx, bool backward) {
  Communicator& g = *groups_.vocab;
  const int P = g.size();
  const std::int64_t V = config_.vocab_size, H = config_.hidden_size;
  Stream& s = dev_.compute_stream();
  constexpr DType kA = dtype_of<A>();
  // The rounds: every rank of the group runs as many as its busiest (empty ones included).
  std::int64_t most = p.T;
  g.all_reduce(&most, 1, DType::i64, ReduceOp::max);
  const std::int64_t R = embedding_round_rows(most, schedules_.embedding_rows);
  if (R == 0) return;
  const ModelEmbeddingBuffers b = model_embedding_buffers(R, P, H, schedules_.precision);
  Buffer ids = dev_.allocate(b.ids.component, b.ids.bytes), order = dev_.allocate(b.order.component, b.order.bytes);
  Buffer recv_ids = dev_.allocate(b.recv_ids.component, b.recv_ids.bytes);
  Buffer rows_out = dev_.allocate(b.rows_out.component, b.rows_out.bytes);
  Buffer rows_in = dev_.allocate(b.rows_in.component, b.rows_in.bytes);
  // The shards' first rows (owner of id: the last shard starting at or before it) and this one's.
  std::vector<std::int64_t> first(static_cast<std::size_t>(P));
  for (int j = 0; j < P; ++j) first[static_cast<std::size_t>(j)] = vocab_shard(V, P, j).offset;
  const VocabShard mine = vocab_shard(V, P, g.rank());
  const std::string name = "model.embed_tokens.weight";
  const A* table = mine.rows > 0 ? head_->param_as<A>(name) : nullptr;
  float* dtable = mine.rows > 0 ? head_->grad(name) : nullptr;
  std::vector<std::int32_t> host_ids(static_cast<std::size_t>(p.T));
  if (p.T > 0) {
    dev_.memcpy_async(host_ids.data(), p.ids.data(), host_ids.size() * sizeof(std::int32_t), CopyKind::device_to_host, s);
    dev_.synchronize(s);
  }
  std::vector<std::size_t> send_n(static_cast<std::size_t>(P)), recv_n(send_n);
  std::vector<std::size_t> ones(static_cast<std::size_t>(P), 1), steps(static_cast<std::size_t>(P));
  for (int j = 0; j < P; ++j) steps[static_cast<std::size_t>(j)] = static_cast<std::size_t>(j);
  std::vector<std::int32_t> by_owner(static_cast<std::size_t>(R));
  std::vector<std::int64_t> where(static_cast<std::size_t>(R));
  auto scale = [H](std::vector<std::size_t> v) {
    for (std::size_t& x : v) x *= static_cast<std::size_t>(H);
    return v;
  };
  for (std::int64_t t0 = 0; t0 < most; t0 += R) {
    const std::int64_t n = std::clamp<std::int64_t>(p.T - t0, 0, R);
    // This round's ids by owner (stable: token order within an owner).
    std::vector<std::int64_t> owner(static_cast<std::size_t>(n));
    std::fill(send_n.begin(), send_n.end(), 0);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t id = host_ids[static_cast<std::size_t>(t0 + i)];
      const auto o = std::upper_bound(first.begin(), first.end(), static_cast<std::int64_t>(id)) - first.begin() - 1;
      owner[static_cast<std::size_t>(i)] = o;
      ++send_n[static_cast<std::size_t>(o)];
    }
    const std::vector<std::size_t> send_at = packed_displs(send_n);
    std::vector<std::size_t> next = send_at;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t k = next[static_cast<std::size_t>(owner[static_cast<std::size_t>(i)])]++;
      by_owner[k] = host_ids[static_cast<std::size_t>(t0 + i)];
      // forward: token i's row is the k-th back (out[i] = rows_in[k]); backward: the k-th
      // row sent is token i's gradient (rows_in[k] = dx[i]).
      where[backward ? k : static_cast<std::size_t>(i)] = backward ? i : static_cast<std::int64_t>(k);
    }
    dev_.memcpy_async(ids.data(), by_owner.data(), static_cast<std::size_t>(n) * sizeof(std::int32_t),
                      CopyKind::host_to_device, s);
    dev_.memcpy_async(order.data(), where.data(), static_cast<std::size_t>(n) * sizeof(std::int64_t),
                      CopyKind::host_to_device, s);
    dev_.synchronize(s);
    // Counts, then the ids to their owners.
    g.all_to_all_v(send_n.data(), ones, steps, recv_n.data(), ones, steps, DType::i64);  // size_t: 8 bytes
    const std::vector<std::size_t> recv_at = packed_displs(recv_n);
    const std::size_t got = recv_at.back() + recv_n.back();
    g.all_to_all_v(ids.data(), send_n, send_at, recv_ids.data(), recv_n, recv_at, DType::i32);
    if (!backward) {
      if (got > 0)
        ops::embedding_forward(dev_, s, rows_out.as<A>(), recv_ids.as<std::int32_t>(), table,
                               static_cast<std::int64_t>(got), H, mine.offset, mine.rows);
      dev_.synchronize(s);
      g.all_to_all_v(rows_out.data(), scale(recv_n), scale(recv_at), rows_in.data(), scale(send_n), scale(send_at), kA);
      if (n > 0) ops::moe_gather_rows(dev_, s, out + t0 * H, rows_in.as<A>(), order.as<std::int64_t>(), n, H);
    } else {
      if (n > 0) ops::moe_gather_rows(dev_, s, rows_in.as<A>(), dx + t0 * H, order.as<std::int64_t>(), n, H);
      dev_.synchronize(s);
      g.all_to_all_v(rows_in.data(), scale(send_n), scale(send_at), rows_out.data(), scale(recv_n), scale(recv_at), kA);
      if (got > 0)
        ops::embedding_backward(dev_, s, dtable, recv_ids.as<std::int32_t>(), rows_out.as<A>(),
                                static_cast<std::int64_t>(got), H, mine.offset, mine.rows);
    }
    dev_.synchronize(s);
  }
}

// The ranks of a context-parallel group must bring the same sequences (each keeps its
// shard): a checksum of the batch compared over the group (collective over it).
bool MoeTransformer::same_sequences(const std::int32_t* ids, const std::int32_t* targets,
                                          std::int64_t sequences, std::int64_t S) const {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(static_cast<std::uint64_t>(sequences));
  mix(static_cast<std::uint64_t>(S));
  for (std::int64_t t = 0; t < sequences * S; ++t) {
    mix(static_cast<std::uint32_t>(ids[t]));
    mix(static_cast<std::uint32_t>(targets[t]));
  }
  const auto v = static_cast<std::int64_t>(h >> 1);
  std::int64_t m[2] = {v, -v};
  groups_.cp->all_reduce(m, 2, DType::i64, ReduceOp::max);
  return m[0] == -m[1];
}

// After the layers' forward: the world's router statistics summed, then the one aux loss.
void MoeTransformer::finish_aux(Pass& p, float aux_scale, bool want_grad) {
  (void)p;
  if (moe_layers_ == 0 || p.world_tokens == 0) return;
  const std::int64_t E = config_.num_experts;
  dev_.synchronize();
  groups_.world->all_reduce(counts_.data(), static_cast<std::size_t>(E), DType::f32, ReduceOp::sum);
  groups_.world->all_reduce(prob_sums_.data(), static_cast<std::size_t>(E), DType::f32, ReduceOp::sum);
  const float coef = static_cast<float>(config_.router_aux_loss_coef);
  ops::moe_aux_loss(dev_, dev_.compute_stream(), aux_loss_.as<float>(),
                    want_grad && coef > 0 ? aux_grad_.as<float>() : nullptr, counts_.as<float>(),
                    prob_sums_.as<float>(), E, moe_layers_ * p.world_tokens, coef * aux_scale);
  finish_seq_aux(p, aux_scale, want_grad);
}

// The sequence-wise balance loss: each sequence's statistics summed over its context-parallel
// group, the loss (the mean over the world's sequences, summed over the layers; every rank
// the same) and, for a backward, the weights in place of the counts. A rank without tokens
// holds no statistics but joins the collectives.
void MoeTransformer::finish_seq_aux(Pass& p, float aux_scale, bool want_grad) {
  if (!(config_.seq_aux_loss_coef > 0) || p.world_sequences == 0) return;
  // n = [M, sequences, E] floats (0 on a rank without tokens): n / E rows of (layer, sequence).
  const std::int64_t E = config_.num_experts, n = static_cast<std::int64_t>(p.seq_counts.bytes() / sizeof(float));
  const int cp = groups_.cp->size();
  Stream& s = dev_.compute_stream();
  dev_.synchronize(s);
  if (cp > 1 && n > 0) {
    groups_.cp->all_reduce(p.seq_counts.data(), static_cast<std::size_t>(n), DType::f32, ReduceOp::sum);
    groups_.cp->all_reduce(p.seq_psum.data(), static_cast<std::size_t>(n), DType::f32, ReduceOp::sum);
  }
  double sum = 0.0;
  if (n > 0) {
    float* loss = aux_loss_.as<float>() + 1;
    const double scale = static_cast<double>(aux_scale) / static_cast<double>(p.world_sequences);
    ops::moe_router_seq_aux_weights(dev_, s, loss, want_grad ? p.seq_counts.as<float>() : nullptr,
                                    p.seq_counts.as<float>(), p.seq_psum.as<float>(), n / E, E, config_.top_k, p.S,
                                    config_.seq_aux_loss_coef, scale);
    float l = 0.0f;
    copy_to_host(dev_, &l, loss, sizeof l);
    sum = l;
  }
  // Every rank of a cp group holds its sequences' whole sums: the world's sum counts each cp times.
  groups_.world->all_reduce(&sum, 1, DType::f64, ReduceOp::sum);
  seq_loss_ = sum / static_cast<double>(cp) / static_cast<double>(p.world_sequences);
  aux_state_->seq_grad = want_grad;
}

template <class A>
BatchSums MoeTransformer::forward_backward_as(const std::int32_t* ids, const std::int32_t* targets,
                                              std::int64_t sequences, std::int64_t S, float ce_scale, float aux_scale) {
  constexpr DType kA = dtype_of<A>();
  Pass p;
  mark_phase(dev_.arena(), "embedding");
  prepare(p, ids, targets, sequences, S);
  const std::int64_t T = p.T, H = config_.hidden_size;
  const ModelBatchBuffers bb = model_batch_buffers(T, H, schedules_.precision);
  Stream& s = dev_.compute_stream();
  // A rank without tokens holds no boundaries but still runs every layer: the MoE
  // layers' dispatch is collective over the expert-parallel group.
  const bool empty = T == 0;
  // keep_attention: each layer's attention keeps o and lse from this forward to its
  // backward (AttentionLayer::set_keep_through), so the backward runs no attention forward.
  for (auto& l : layers_) l->attention->set_keep_through(schedules_.keep_attention);
  // keep_experts: each MoE layer's dispatch keeps its experts' forward for its backward.
  for (auto& l : layers_) l->mlp->set_keep_experts(schedules_.keep_experts);
  const bool park = !empty && parks_final_hidden(schedules_);
  if (!empty && (!stack_ || stack_tokens_ != T)) {
    stack_.reset();
    y_host_.reset();
    std::vector<Block*> blocks;
    for (auto& l : layers_) blocks.push_back(l->fsdp.get());
    stack_ = std::make_unique<CheckpointedStack>(dev_, host_, blocks, Shape{T, H}, kA, schedules_.checkpoint);
    if (park) y_host_ = host_.allocate(bb.y_host.component, bb.y_host.bytes);
    slot_host_.reset();
    if (park && parks_slot(stack_->placement())) {
      const CheckpointBuffers& cb = stack_->buffers();
      slot_host_ = host_.allocate(cb.host_boundary.component, cb.host_boundary.bytes);
    }
    out_host_.release(dev_);
    out_host_.reserve(dev_, attention_output_host_bytes(T, layers_.front()->attention->config()));
    stack_tokens_ = T;
  }
  // The embedding writes into the stack's first boundary: the forward holds no x.
  const Shape sh{T, H};
  Buffer y;
  if (empty) {
    p.x = dev_.allocate(bb.x.component, bb.x.bytes);
    embed<A>(p, p.x.as<A>());
    y = dev_.allocate(bb.y.component, bb.y.bytes);
    for (auto& l : layers_) l->fsdp->forward(p.x.tensor(sh, kA), y.tensor(sh, kA));
  } else {
    const Tensor x0 = stack_->input();
    embed<A>(p, x0.data<A>());
    y = dev_.allocate(bb.y.component, bb.y.bytes);
    stack_->forward(x0, y.tensor(sh, kA));
    if (slot_host_.bytes() > 0) stack_->park_slot(slot_host_.data());  // until the stack's backward
  }
  finish_aux(p, aux_scale, true);

  mark_phase(dev_.arena(), "loss");
  // Final norm (its unit gathered, its gradient reduced once its backward is done) and the head.
  const FsdpBuffers& fb = fsdp_->buffers();
  const std::size_t nu = fsdp_->norm();
  const u64 norm_at = fsdp_->find("model.norm.weight").second->offset;
  Buffer norm_w = dev_.allocate(fb.norm_params.component, fb.norm_params.bytes);
  fsdp_->gather(nu, norm_w.data());
  // x from here on: the final norm's output, then the gradient below.
  p.x = dev_.allocate(bb.x.component, bb.x.bytes);
  Buffer& hn = p.x;
  Buffer rstd = dev_.allocate(bb.rstd.component, bb.rstd.bytes);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const A* w_norm = norm_w.as<A>() + norm_at;
  if (T > 0) ops::rmsnorm_forward(dev_, s, hn.as<A>(), rstd.as<float>(), y.as<A>(), w_norm, T, H, eps);
  // parks_final_hidden: y to the host until the final norm's backward, on the compute
  // stream (nothing to overlap it with: the loss needs y's memory), so whatever reuses
  // that memory is ordered after the copy.
  if (park) {
    dev_.memcpy_async(y_host_.data(), y.data(), bb.y.bytes, CopyKind::device_to_host, s);
    y.reset();
  }
  const A* w_head = head_->contains("lm_head.weight") ? head_->param_as<A>("lm_head.weight") : nullptr;
  float* d_head = head_->contains("lm_head.weight") ? head_->grad("lm_head.weight") : nullptr;
  // The scale is known up front (the trainer counted the valid targets): a one-rank
  // vocabulary group takes Ring-DTP's fused form (no recompute, one logits block).
  LossSum ls;
  Buffer d_hn;
  // Ring-DTP scores only the rows with a target (scored_runs above): hn's rows and the
  // targets compact in place (hn's last reader is the loss), d_hn's expand after it.
  const ScoredRuns& scored = p.scored;
  const std::int64_t Tv = schedules_.ring_dtp ? scored.count() : T;
  if (Tv < T) {
    compact_scored(dev_, s, hn.data(), static_cast<std::size_t>(H) * sizeof(A), scored);
    dev_.memcpy_async(p.targets.data(), scored.targets.data(), static_cast<std::size_t>(Tv) * sizeof(std::int32_t),
                      CopyKind::host_to_device, s);
  }
  // Its buffers as planned, whatever the targets; the reservation ends when this step
  // returns or throws (a bad target), so no later forward is sized by it.
  struct Reservation {
    VocabLoss& loss;
    ~Reservation() { loss.reserve_tokens(0); }
  } reservation{*vocab_loss_};
  if (schedules_.ring_dtp) vocab_loss_->reserve_tokens(T);
  if (schedules_.ring_dtp && groups_.vocab->size() == 1) {
    d_hn = dev_.allocate(bb.d_hn.component, bb.d_hn.bytes);
    ls = vocab_loss_->forward_backward(hn.as<A>(), p.targets.as<std::int32_t>(), Tv, w_head, ce_scale,
                                       d_hn.as<A>(), d_head);
  } else {
    ls = vocab_loss_->forward(hn.as<A>(), p.targets.as<std::int32_t>(), Tv, w_head);
    d_hn = dev_.allocate(bb.d_hn.component, bb.d_hn.bytes);
    vocab_loss_->backward(ce_scale, d_hn.as<A>(), d_head);
  }
  if (Tv < T) expand_scored(dev_, s, d_hn.as<A>(), H, T, scored);
  // The layers' backward runs in place (every block's backward_in_place, the stack's one
  // gradient buffer): the final norm's gradient goes into x's buffer (the normed hidden's
  // last reader was the loss), and the layers turn it into dx there. parks_final_hidden:
  // the normed hidden is freed, y comes back, and the norm's backward writes dy over d_hn
  // a row tile at a time (each row's the same operations, the weight's gradient added in
  // the same row order: the same bits); d_hn's buffer is then x's.
  if (park) {
    p.x.reset();
    y = dev_.allocate(bb.y.component, bb.y.bytes);
    dev_.memcpy_async(y.data(), y_host_.data(), bb.y.bytes, CopyKind::host_to_device, s);
  }
  {
    Buffer norm_g = dev_.allocate(fb.norm_grads.component, fb.norm_grads.bytes);
    ops::fill(dev_, s, norm_g.as<float>(), static_cast<std::int64_t>(fsdp_->layout(nu).elements), 0.0f);
    if (park) {
      const Buffer tile = dev_.allocate(bb.norm_tile.component, bb.norm_tile.bytes);
      for (std::int64_t r0 = 0; r0 < T; r0 += kFinalNormTileRows) {
        const std::int64_t rows = std::min(kFinalNormTileRows, T - r0);
        ops::fill(dev_, s, tile.as<A>(), rows * H, 0.0f);
        ops::rmsnorm_backward(dev_, s, tile.as<A>(), norm_g.as<float>() + norm_at, d_hn.as<A>() + r0 * H,
                              y.as<A>() + r0 * H, w_norm, rstd.as<float>() + r0, rows, H);
        dev_.memcpy_async(d_hn.as<A>() + r0 * H, tile.data(), static_cast<std::size_t>(rows * H) * sizeof(A),
                          CopyKind::device_to_device, s);
      }
    } else if (T > 0) {
      ops::fill(dev_, s, p.x.as<A>(), T * H, 0.0f);
      ops::rmsnorm_backward(dev_, s, p.x.as<A>(), norm_g.as<float>() + norm_at, d_hn.as<A>(), y.as<A>(),
                            w_norm, rstd.as<float>(), T, H);
    }
    fsdp_->reduce_add(nu, norm_g.as<float>());
  }
  if (park) p.x = std::move(d_hn);
  Buffer& dy = p.x;
  norm_w.reset();
  d_hn.reset();
  y.reset();
  rstd.reset();
  // x's buffer takes dy, then dx.
  if (empty) {
    // The calls the stacks of the ranks with tokens make (their recomputations' dispatch
    // and gathers are collective).
    for (const CheckpointBlockCall& call :
         checkpoint_backward_calls(static_cast<std::int64_t>(layers_.size()), schedules_.checkpoint.group_layers)) {
      Block& b = *layers_[static_cast<std::size_t>(call.block)]->fsdp;
      if (call.recompute)
        b.forward_recompute(p.x.tensor(sh, kA), y.tensor(sh, kA));
      else
        b.backward(p.x.tensor(sh, kA), dy.tensor(sh, kA), p.x.tensor(sh, kA));
    }
  } else {
    stack_->backward(dy.tensor(sh, kA), p.x.tensor(sh, kA));
  }
  mark_phase(dev_.arena(), "embedding backward");
  if (schedules_.vocab_parallel_embedding) {
    // Each token's row gradient to the row's owner, added into the store's shard (reduced
    // over the store's replicas with the head's).
    embed_exchange<A>(p, nullptr, p.x.as<A>(), true);
  } else {
    // The embedding's full gradient (no weights needed), then its reduce-scatter.
    Buffer emb_g = dev_.allocate(fb.embed_grads.component, fb.embed_grads.bytes);
    const std::size_t eu = FsdpUnits::embed();
    ops::fill(dev_, s, emb_g.as<float>(), static_cast<std::int64_t>(fsdp_->layout(eu).elements), 0.0f);
    if (T > 0)
      ops::embedding_backward(dev_, s, emb_g.as<float>() + fsdp_->find("model.embed_tokens.weight").second->offset,
                              p.ids.as<std::int32_t>(), p.x.as<A>(), T, H, 0, config_.vocab_size);
    fsdp_->reduce_add(eu, emb_g.as<float>());
  }
  fsdp_->finish();  // nothing stays in flight past the pass
  dev_.synchronize();
  return batch_sums(ls, p);
}

// This rank's loss sums and the world's aux term (set by finish_aux when it ran).
BatchSums MoeTransformer::batch_sums(const LossSum& ls, const Pass& p) const {
  BatchSums out;
  out.ce = ls.loss;
  out.tokens = ls.count;
  if (moe_layers_ > 0 && p.world_tokens > 0) {
    float aux = 0.0f;
    copy_to_host(dev_, &aux, aux_loss_.data(), sizeof aux);
    out.aux = config_.router_aux_loss_coef * aux + seq_loss_;
  }
  return out;
}

template <class A>
BatchSums MoeTransformer::forward_as(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                                     std::int64_t S) {
  constexpr DType kA = dtype_of<A>();
  Pass p;
  // An evaluation routes tokens but adds nothing to the loads of the bias update.
  struct NoLoads {
    MoeAuxState& a;
    ~NoLoads() { a.count_loads = true; }
  } no_loads{*aux_state_};
  aux_state_->count_loads = false;
  mark_phase(dev_.arena(), "eval");
  for (auto& l : layers_) {  // no backward follows: keep nothing
    l->attention->set_keep_through(false);
    l->mlp->set_keep_experts(false);
  }
  prepare(p, ids, targets, sequences, S);
  const std::int64_t T = p.T, H = config_.hidden_size;
  const ModelBatchBuffers bb = model_batch_buffers(T, H, schedules_.precision);
  const Shape sh{T, H};
  p.x = dev_.allocate(bb.x.component, bb.x.bytes);
  embed<A>(p, p.x.as<A>());
  Buffer other = dev_.allocate(bb.y.component, bb.y.bytes);
  Buffer* in = &p.x;
  Buffer* out = &other;
  for (auto& l : layers_) {
    l->fsdp->forward(in->tensor(sh, kA), out->tensor(sh, kA));
    std::swap(in, out);
  }
  finish_aux(p, 1.0f, false);
  Stream& s = dev_.compute_stream();
  Buffer rstd = dev_.allocate(bb.rstd.component, bb.rstd.bytes);
  const FsdpBuffers& fb = fsdp_->buffers();
  Buffer norm_w = dev_.allocate(fb.norm_params.component, fb.norm_params.bytes);
  fsdp_->gather(fsdp_->norm(), norm_w.data());
  if (T > 0)
    ops::rmsnorm_forward(dev_, s, out->as<A>(), rstd.as<float>(), in->as<A>(),
                         norm_w.as<A>() + fsdp_->find("model.norm.weight").second->offset, T, H,
                         static_cast<float>(config_.rms_norm_eps));
  norm_w.reset();
  const A* w_head = head_->contains("lm_head.weight") ? head_->param_as<A>("lm_head.weight") : nullptr;
  const LossSum ls = vocab_loss_->forward(out->as<A>(), p.targets.as<std::int32_t>(), T, w_head);
  vocab_loss_->discard();  // no backward follows: nothing of it may stay held
  fsdp_->finish();
  dev_.synchronize();
  return batch_sums(ls, p);
}

BatchSums MoeTransformer::forward_backward(const std::int32_t* ids, const std::int32_t* targets,
                                           std::int64_t sequences, std::int64_t S, float ce_scale, float aux_scale) {
  if (schedules_.precision == Precision::bf16)
    return forward_backward_as<bf16>(ids, targets, sequences, S, ce_scale, aux_scale);
  return forward_backward_as<float>(ids, targets, sequences, S, ce_scale, aux_scale);
}

BatchSums MoeTransformer::forward(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                                  std::int64_t S) {
  if (schedules_.precision == Precision::bf16) return forward_as<bf16>(ids, targets, sequences, S);
  return forward_as<float>(ids, targets, sequences, S);
}

}  // namespace peakbound
