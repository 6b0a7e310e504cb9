#include "peakbound/train/train_footprint.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/precision.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/layers/moe_layer.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/schedules/checkpoint_policy.h"
#include "peakbound/schedules/optimizer_footprint.h"
#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/parameter_store.h"
#include "peakbound/train/trainer.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
constexpr u64 kF32 = 4;  // gradients, the master, m, v and statistics in both precisions

// The table's entries and the FSDP unit layouts of the last model sized over a group of
// `world` ranks. They depend on neither the rank nor the schedules, and `plan` sizes one
// model for many ranks, policies and contexts (a 235B model's table has ~37k entries:
// rebuilding them per call made a 256-device plan take minutes).
struct ModelLayouts {
  std::vector<TensorEntry> entries;
  std::vector<ParameterLayout> fsdp_units;
};
// Throws InvalidArgument for a config the TensorTable refuses (a cached one was accepted).
std::shared_ptr<const ModelLayouts> model_layouts(const ModelConfig& c, int world, bool with_embedding) {
  static std::mutex mu;
  static std::optional<std::tuple<ModelConfig, int, bool>> key;
  static std::shared_ptr<const ModelLayouts> cached;
  const std::lock_guard<std::mutex> lock(mu);
  if (!key || std::get<0>(*key) != c || std::get<1>(*key) != world || std::get<2>(*key) != with_embedding) {
    const TensorTable table(c, TableLayout::trainer);  // the trainer's stores (gpt-oss: per-expert rows)
    auto m = std::make_shared<ModelLayouts>();
    m->entries = table.entries();
    m->fsdp_units = fsdp_unit_layouts(table, world, with_embedding);
    cached = std::move(m);
    key.emplace(c, world, with_embedding);
  }
  return cached;
}

// Adds a phase of another footprint (device and host, per component) into `phase`.
// Its bytes are already Arena-reserved sums (multiples of the alignment), which
// BufferSpec::reserved() leaves as they are.
void add_phase(Footprint& f, const std::string& phase, const Footprint::Phase& p) {
  for (Component c : kAllComponents) {
    const auto i = static_cast<std::size_t>(c);
    f.device(phase, BufferSpec{c, p.device[i]});
    f.host(phase, BufferSpec{c, p.host[i]});
  }
}

}  // namespace

DispatchSizes dispatch_sizes_max(const std::vector<DispatchSizes>& sizes) {
  DispatchSizes m;
  for (const DispatchSizes& s : sizes) {
    m.max_sent = std::max(m.max_sent, s.max_sent);
    m.max_received = std::max(m.max_received, s.max_received);
    m.double_buffered = m.double_buffered || s.double_buffered;
    m.foreign = std::max(m.foreign, s.foreign);
    m.lent = std::max(m.lent, s.lent);
    m.tokens = std::max(m.tokens, s.tokens);
    m.computed = std::max(m.computed, s.computed);
  }
  return m;
}

namespace {

// The trainer's footprint, phase by phase in the order the run reaches them: each
// member function below adds the phases of one part of the step.
class TrainFootprintBuilder {
 public:
  explicit TrainFootprintBuilder(const TrainFootprintInputs& in)
      : in_(in), c_(in.model), cp_(static_cast<int>(in.layout.cp)), L_(in.model.num_layers),
        H_(in.model.hidden_size), sch_(in.schedules), p_(in.schedules.precision),
        act_bytes_(dtype_size(activation_dtype(p_))) {}

  Footprint build() {
    check_trainable(c_);
    g_ = StoreGroups::of(in_.layout, in_.world, in_.rank);
    check_inputs();
    T_ = tokens_of(in_.rank);
    // The layers' attention config as MoeTransformer builds it (its bf16 tiles follow the
    // precision; o_proj's row tile is the MLP's; o on the host with the one-slot ring).
    ac_ = model_attention_config(c_, in_.seq_len, cp_, in_.rank % cp_, sch_.attention_piece);
    ac_.precision = p_;
    ac_.threads = sch_.attention_threads;
    ac_.output_rows = sch_.moe_tile;
    ac_.output_on_host = offloads_attention_output(sch_);
    size_persistent();
    size_stack();
    optimizer_load();
    embedding_forward();
    att_ = attention_layer_footprint(T_, ac_);
    size_kept_experts();
    forward_attention();
    plan_mlps();
    mlp_forwards();
    vocab_loss();
    layer_backwards();
    recomputations();
    embedding_backward();
    persistent("optimizer", true);  // the optimizer step
    return std::move(f_);
  }

 private:
  struct Mlp {
    std::int64_t layer;
    std::string fwd, bwd, rec;  // forward, backward, a checkpoint group's recomputation
    Footprint layer_fp, dispatch_fp;
    bool dispatch = false;
  };

  void check_inputs() const {
    if (!in_.rank_sequences.empty() && static_cast<int>(in_.rank_sequences.size()) != in_.world)
      throw InvalidArgument("train footprint: rank_sequences has " + std::to_string(in_.rank_sequences.size()) +
                            " entries for " + std::to_string(in_.world) + " ranks");
    // Context parallel: rank r is rank r % cp of its group and holds its zigzag shard of
    // each sequence (the group's ranks bring the same sequences).
    check_context_split(cp_, in_.seq_len);
    check_model_schedules(sch_);
  }
  std::int64_t sequences_of(int r) const {
    return in_.rank_sequences.empty() ? in_.sequences : in_.rank_sequences[static_cast<std::size_t>(r)];
  }
  std::int64_t tokens_of(int r) const {
    const std::int64_t n = sequences_of(r);
    if (n < 0 || in_.seq_len < 1) throw InvalidArgument("train footprint: need sequences >= 0 and seq_len >= 1");
    const std::int64_t local = cp_ > 1 ? zigzag_shard(in_.seq_len, cp_, r % cp_).tokens() : in_.seq_len;
    return static_cast<std::int64_t>(checked_mul(static_cast<u64>(n), static_cast<u64>(local), "train footprint tokens"));
  }

  // ---- persistent: stores, shards, optimizer, aux
  void size_persistent() {
    const ModelStoreSpecs specs = model_store_specs(c_, g_, sch_.vocab_parallel_embedding);
    // The FSDP units (train/fsdp_units.h): shards, reduce scratch, the two layer slots of
    // parameters and of gradients, all held for the model's life.
    const std::shared_ptr<const ModelLayouts> lay = model_layouts(c_, g_.world, !sch_.vocab_parallel_embedding);
    // The stores, then the FSDP shard buffers with the stores' slices in their tail (the
    // optimizer's shard, updated in place: MoeTransformer's constructor). A store
    // of a one-rank group is its slice: it lives in the tail, with no buffers of its own.
    u64 tail = 0;
    const StoreSpec* stores[2] = {&specs.experts, &specs.head};
    const int group_size[2] = {g_.ep_replicas, g_.vocab_replicas};
    for (int i = 0; i < 2; ++i) {
      const ParameterLayout store = parameter_layout(lay->entries, stores[i]->select, stores[i]->options);
      if (group_size[i] > 1) {
        const ParameterStoreBuffers b = parameter_store_buffers(store, p_);
        resident_dev_.push_back(b.params);
        resident_dev_.push_back(b.grads);
      }
      tail = checked_add(tail, store.elements / static_cast<u64>(group_size[i]), "trainer shard");
    }
    fb_ = fsdp_buffers(lay->fsdp_units, g_.world, p_, tail);
    for (const BufferSpec& b : {fb_.params_shard, fb_.grads_shard, fb_.scratch, fb_.layer_params, fb_.layer_params,
                                fb_.layer_grads, fb_.layer_grads})
      resident_dev_.push_back(b);
    const u64 shard = fb_.grads_shard.bytes / kF32;  // units and slices; the gradients are f32 in both precisions
    const ModelAuxBuffers ab = model_aux_buffers(c_.num_experts);
    for (const BufferSpec& b : {ab.counts, ab.prob_sums, ab.aux_grad, ab.loss}) resident_dev_.push_back(b);
    const ModelRouterStateBuffers rb = model_router_state_buffers(c_);
    for (const BufferSpec& b : {rb.correction, rb.loads}) resident_dev_.push_back(b);
    // The optimizer's shard: parameters in the model's param dtype, gradients f32.
    const ParamShard ps{nullptr, param_dtype(p_), nullptr, DType::f32, static_cast<std::int64_t>(shard)};
    opt_ = optimizer_footprint(in_.optimizer, optimizer_shape(ps), in_.optimizer_options);
    bb_ = model_batch_buffers(T_, H_, p_, seq_aux_floats(c_, T_ > 0 ? sequences_of(in_.rank) : 0));
  }
  // The stack (built on the first step with tokens): the checkpoint ring and host boundaries.
  void size_stack() {
    stacked_ = T_ > 0;
    if (stacked_)
      cb_ = checkpoint_buffers(L_, checked_mul(static_cast<u64>(T_), static_cast<u64>(H_), "[T, H]"), act_bytes_,
                               sch_.checkpoint, /*in_place=*/true);  // the decoder layers' backward runs in place
    groups_ = checkpoint_group_count(L_, G_);
    ringed_ = stacked_ ? cb_.placement.ringed() : groups_;
  }
  // Checkpoint groups (CheckpointOptions::group_layers): block l's group, and its place in it.
  std::int64_t group_of(std::int64_t l) const { return checkpoint_group_of(L_, G_, l); }
  std::int64_t index_in_group(std::int64_t l) const { return l - checkpoint_group(L_, G_, group_of(l)).first; }
  bool last_in_group(std::int64_t l) const {
    const CheckpointGroup g = checkpoint_group(L_, G_, group_of(l));
    return l == g.first + g.count - 1;
  }

  // Everything held from the trainer's construction on, plus the stack's ring and host
  // boundaries once it exists.
  // slot_parked: between the stack's forward and its backward under parks_slot (the
  // slot's boundary on the host, its device memory free).
  void persistent(const std::string& phase, bool with_stack, bool slot_parked = false) {
    for (const BufferSpec& b : resident_dev_) f_.device(phase, b);
    add_phase(f_, phase, opt_.phase("step"));
    if (with_stack && stacked_) {
      const bool parks = parks_final_hidden(sch_) && parks_slot(cb_.placement);
      f_.device(phase, cb_.boundary, static_cast<u64>(cb_.placement.ring_slots - (slot_parked && parks ? 1 : 0)));
      f_.host(phase, cb_.host_boundary, static_cast<u64>(cb_.placement.offloaded + (parks ? 1 : 0)));
      if (parks_final_hidden(sch_)) f_.host(phase, bb_.y_host);  // allocated with the stack
      f_.host(phase, BufferSpec{Component::attention, attention_output_host_bytes(T_, ac_)});  // with the stack too
    }
  }
  // Resident boundaries (one per checkpoint group) live through group k: while block l
  // runs forward, through group_of(l) + 1 (its group's output acquired); in its backward
  // through group_of(l) (the later groups' freed once their backward is done).
  std::int64_t resident_count(std::int64_t live_through) const {
    if (!stacked_) return 0;
    return std::max<std::int64_t>(0, std::min(live_through, groups_ - 1) - ringed_ + 1);
  }
  void residents(const std::string& phase, std::int64_t live_through) {
    if (stacked_) f_.device(phase, cb_.boundary, static_cast<u64>(resident_count(live_through)));
  }
  // keep_attention: the o and lse of `layers` layers held from their forward to their
  // backward (AttentionLayer::set_keep_through); nothing without it.
  void kept(const std::string& phase, std::int64_t layers) {
    if (!sch_.keep_attention || !stacked_) return;
    for (std::int64_t l = 0; l < layers; ++l) add_phase(f_, phase, att_.phase("kept"));
  }
  // keep_experts: what the MoE layers among the first `layers` kept of their experts'
  // forward (MoeLayer::set_keep_experts), held from each one's forward to the end of its
  // backward; nothing without it. A rank without tokens keeps too: its experts compute
  // the group's rows.
  void kept_experts(const std::string& phase, std::int64_t layers) {
    if (!sch_.keep_experts) return;
    for (std::int64_t l = 0; l < std::min(layers, L_); ++l)
      if (kept_experts_[static_cast<std::size_t>(l)].bytes > 0) f_.device(phase, kept_experts_[static_cast<std::size_t>(l)]);
  }
  // Each layer's kept experts (0 bytes for a dense layer): dispatch_kept_buffer of the
  // rows its dispatch computes over the call's tiles: measured (dispatch_layers, or
  // dispatch for every layer) or the estimate's busiest load for each tile.
  void size_kept_experts() {
    kept_experts_.assign(static_cast<std::size_t>(L_), BufferSpec{Component::dispatch, 0});
    if (!sch_.keep_experts) return;
    for (std::int64_t l = 0, i = 0; l < L_; ++l) {
      if (!c_.is_moe_layer(l)) continue;
      const MoeLayerConfig mc = layer_mlp_config(l);
      const MoeShape shape = moe_layer_dispatch_shape(mc);
      std::int64_t rows = 0;
      if (!in_.dispatch_layers.empty()) {
        rows = in_.dispatch_layers.at(static_cast<std::size_t>(i)).computed;
      } else if (in_.dispatch) {
        rows = in_.dispatch->computed;
      } else {
        // Each tile's store sized for the group's largest tile, as many as the group runs.
        const std::int64_t tiles = moe_tile_count(ep_tokens(), mc.seq_tile);
        rows = static_cast<std::int64_t>(
            checked_mul(static_cast<u64>(dispatch_kept_rows(shape, dispatch_estimate(mc).computed, p_)),
                        static_cast<u64>(tiles), "kept experts rows"));
      }
      kept_experts_[static_cast<std::size_t>(l)] = dispatch_kept_buffer(shape, rows, p_);
      ++i;
    }
  }
  // The dispatch sizes the planner reserves for one tile of the layer `mc` configures: the
  // expert group's largest tile, at the skew the layout allows.
  DispatchSizes dispatch_estimate(const MoeLayerConfig& mc) const {
    return dispatch_sizes_estimate(sch_.dispatch, moe_layer_dispatch_shape(mc), g_.ep,
                                   moe_tile_rows(ep_tokens(), mc.seq_tile), dispatch_skew(), sch_.dispatch_options,
                                   p_);
  }
  // The MLP sublayer config of layer l as MoeTransformer builds it.
  MoeLayerConfig layer_mlp_config(std::int64_t l) const {
    MoeLayerConfig mc = moe_layer_config(c_, l, static_cast<float>(c_.rms_norm_eps), sch_.dispatch, sch_.dispatch_options);
    mc.precision = p_;  // as MoeTransformer sets it (its dispatch's too)
    mc.seq_tile = sch_.moe_tile;
    return mc;
  }
  void batch(const std::string& phase, std::initializer_list<BufferSpec> live) {
    f_.device(phase, bb_.ids);
    f_.device(phase, bb_.targets);
    f_.device(phase, bb_.seq_counts);
    f_.device(phase, bb_.seq_psum);
    for (const BufferSpec& b : live) f_.device(phase, b);
  }

  // ---- the trainer's constructor
  void optimizer_load() {
    const std::string ph = "optimizer load";
    for (const BufferSpec& b : resident_dev_) f_.device(ph, b);
    add_phase(f_, ph, opt_.phase("load"));
  }
  // The embedding, gathered for its forward (every step, before the layers), written
  // into the stack's first boundary (a rank without tokens: into x, 0 bytes).
  void embedding_forward() {
    const std::string ph = "embedding forward";
    persistent(ph, true);
    batch(ph, {});
    residents(ph, 0);
    f_.device(ph, fb_.embed_params);  // 0 bytes under the vocabulary-parallel embedding
    embedding_exchange(ph);
  }
  // The vocabulary-parallel embedding's buffers in its forward and backward (rounds sized
  // by the vocabulary group's most tokens); nothing without it.
  void embedding_exchange(const std::string& ph) {
    if (!sch_.vocab_parallel_embedding) return;
    std::int64_t most = 0;
    for (int r = in_.rank - g_.vocab_rank; r < in_.rank - g_.vocab_rank + g_.vocab; ++r)
      most = std::max(most, tokens_of(r));
    const std::int64_t R = embedding_round_rows(most, sch_.embedding_rows);
    if (R == 0) return;
    const ModelEmbeddingBuffers b = model_embedding_buffers(R, g_.vocab, H_, p_);
    for (const BufferSpec& s : {b.ids, b.order, b.recv_ids, b.rows_out, b.rows_in}) f_.device(ph, s);
    if (in_.evaluates && ph == "embedding forward") {
      // The held-out loss's forward embeds into x (MoeTransformer::forward).
      const std::string eval = "embedding eval";
      persistent(eval, true);
      batch(eval, {bb_.x});
      for (const BufferSpec& s : {b.ids, b.order, b.recv_ids, b.rows_out, b.rows_in}) f_.device(eval, s);
    }
  }
  // Forward, the last layer's attention sublayer (every layer's is the same size), writing
  // into y (the MoE layer then runs in place on it: no mid in the forward). Its projections
  // ("... project", h live) and its kernel (h freed).
  void forward_attention() {
    // The phases the layer's forward reaches (o on the host: o_proj reading it back, too).
    for (const std::string_view part : attention_call_phases(T_, ac_, AttentionCall::forward)) {
      const std::string ph = "forward attention" + std::string(forward_suffix(part));
      persistent(ph, true);
      batch(ph, {bb_.y});
      residents(ph, groups_);  // the last layer's: every boundary live
      add_phase(f_, ph, att_.phase(part));
      kept(ph, L_ - 1);  // the earlier layers'
      kept_experts(ph, L_ - 1);
    }
  }

  // The MLP sublayers whose moments are phases: the last dense layer and the last MoE
  // layer, or every MoE layer when each has its own measured dispatch sizes.
  void plan_mlps() {
    std::int64_t last_dense = -1, last_moe = -1, moe_count = 0;
    for (std::int64_t l = 0; l < L_; ++l) {
      (c_.is_moe_layer(l) ? last_moe : last_dense) = l;
      moe_count += c_.is_moe_layer(l) ? 1 : 0;
    }
    if (!in_.dispatch_layers.empty() && static_cast<std::int64_t>(in_.dispatch_layers.size()) != moe_count)
      throw InvalidArgument("train footprint: dispatch_layers has " + std::to_string(in_.dispatch_layers.size()) +
                            " entries for " + std::to_string(moe_count) + " MoE layers");
    // Each sublayer's footprint once (mlp_at), whichever moments name it.
    std::vector<std::int64_t> moe_index(static_cast<std::size_t>(L_), -1);
    for (std::int64_t l = 0, k = 0; l < L_; ++l)
      if (c_.is_moe_layer(l)) moe_index[static_cast<std::size_t>(l)] = k++;
    const auto take = [&](std::vector<std::int64_t>& moments, std::int64_t l) {
      const std::int64_t i = moe_index[static_cast<std::size_t>(l)];
      const bool every = i >= 0 && !in_.dispatch_layers.empty();
      if (!mlps_.contains(l)) mlps_.emplace(l, mlp_at(l, i, every && l != last_moe ? " (layer " + std::to_string(l) + ")" : ""));
      moments.push_back(l);
    };
    // Forward: the last of each kind (every MoE layer with its own sizes).
    for (std::int64_t l = 0; l < L_; ++l) {
      const bool moe = c_.is_moe_layer(l);
      if (l == (moe ? last_moe : last_dense) || (moe && !in_.dispatch_layers.empty())) take(forward_mlps_, l);
    }
    // Backward and a group's recomputation: the layer of each kind holding the most
    // boundaries then (without groups: the last of its kind, as above), or every MoE layer
    // with its own sizes (recomputed: those not last in their group).
    for (const bool recompute : {false, true}) {
      if (recompute && G_ <= 1) break;
      const std::int64_t dense_at = most_boundaries(false, recompute), moe_at = most_boundaries(true, recompute);
      for (std::int64_t l = 0; l < L_; ++l) {
        const bool moe = c_.is_moe_layer(l);
        if (moe && !in_.dispatch_layers.empty() ? !(recompute && last_in_group(l)) : l == (moe ? moe_at : dense_at))
          take(recompute ? recompute_mlps_ : backward_mlps_, l);
      }
    }
  }
  // The layer (of the kind `moe` says, or any) whose backward, or whose group's
  // recomputation, holds the most boundaries: the resident ones and the group's recomputed
  // inputs (ties: the later); -1 where none.
  std::int64_t most_boundaries(std::optional<bool> moe, bool recompute) const {
    std::int64_t best = -1, live = -1;
    for (std::int64_t l = 0; l < L_; ++l) {
      if ((moe && c_.is_moe_layer(l) != *moe) || (recompute && last_in_group(l))) continue;
      const std::int64_t n = resident_count(group_of(l)) + index_in_group(l) + (recompute ? 1 : 0);
      if (n >= live) best = l, live = n;
    }
    return best;
  }
  // MLP sublayer l's footprint and its phases' names (i: its index among the MoE layers, or -1).
  Mlp mlp_at(std::int64_t l, std::int64_t i, const std::string& suffix) const {
    const bool moe = i >= 0;
    const bool every = moe && !in_.dispatch_layers.empty();
    const MoeLayerConfig mc = layer_mlp_config(l);
    Mlp m;
    m.layer = l;
    const std::string kind = moe ? "mlp" : "dense mlp";
    m.fwd = "forward " + kind + suffix;
    m.bwd = "backward " + kind + suffix;
    m.rec = "recompute " + kind + suffix;
    m.layer_fp = moe_layer_footprint(T_, mc);
    if (moe) {
      const MoeShape shape = moe_layer_dispatch_shape(mc);
      DispatchSizes ds = every          ? in_.dispatch_layers[static_cast<std::size_t>(i)]
                         : in_.dispatch ? *in_.dispatch
                                        : dispatch_estimate(mc);
      // Its host scratch is this rank's own tile's.
      if (!every && !in_.dispatch) ds.tokens = moe_tile_rows(T_, mc.seq_tile);
      m.dispatch_fp = dispatch_footprint(shape, ds, p_);
      m.dispatch = true;
    }
    return m;
  }
  // The estimate sizes the exchange for the expert group's largest source (every rank of
  // the group sizes its rounds alike): the most tokens any rank of the group holds
  // (ProcessGroups::split's consecutive groups; ranks differ under cp or uneven batches).
  std::int64_t ep_tokens() const {
    std::int64_t most = 0;
    for (int r = in_.rank - g_.ep_rank; r < in_.rank - g_.ep_rank + g_.ep; ++r) most = std::max(most, tokens_of(r));
    return most;
  }
  // No routing loads a rank with more than every source's tokens at min(k, E/EP) copies
  // each: the skew the layout allows at most (the planner's worst, plan_shapes).
  double dispatch_skew() const {
    if (c_.num_experts <= 0 || c_.top_k <= 0) return in_.skew;
    return std::min(in_.skew, std::max(1.0, static_cast<double>(g_.ep) *
                                                static_cast<double>(std::min<std::int64_t>(c_.top_k, c_.num_experts / g_.ep)) /
                                                static_cast<double>(c_.top_k)));
  }
  void mlp_forwards() {
    for (const std::int64_t l : forward_mlps_) {
      const Mlp& m = mlps_.at(l);
      persistent(m.fwd, true);
      batch(m.fwd, {bb_.y});
      residents(m.fwd, group_of(m.layer) + 1);
      kept(m.fwd, m.layer + 1);  // this layer's and the earlier ones'
      kept_experts(m.fwd, m.layer + 1);
      add_phase(f_, m.fwd, m.layer_fp.phase("forward"));
      if (m.dispatch) add_phase(f_, m.fwd, m.dispatch_fp.phase("forward"));
    }
  }

  // ---- final norm and the vocabulary loss
  void vocab_loss() {
    // The vocabulary group: ranks [first, first + vocab) (ProcessGroups::split's consecutive groups).
    VocabLossShape vs;
    vs.dims = VocabDims{c_.vocab_size, H_};
    vs.rank = g_.vocab_rank;
    const int first = in_.rank - g_.vocab_rank;
    for (int r = first; r < first + g_.vocab; ++r) vs.tokens.push_back(tokens_of(r));
    // A one-rank group under Ring-DTP runs the fused forward_backward: d_hn is allocated
    // first and one phase of the loss holds it with the fused block (both phases below).
    const bool fused = sch_.ring_dtp && ring_dtp_fuses(vs);
    // parks_final_hidden: y on the host from the final norm's forward to its backward
    // (that moment is the norm's forward, y and its output x beside each other).
    const bool park = stacked_ && parks_final_hidden(sch_);
    const BufferSpec y_dev = park ? BufferSpec{bb_.y.component, 0} : bb_.y;
    VocabLossOptions vo = sch_.vocab;
    vo.precision = p_;  // the model's precision rules the head's (MoeTransformer)
    const Footprint voc = fused          ? ring_dtp_step_footprint(vs, vo, p_)
                          : sch_.ring_dtp ? ring_dtp_footprint(vs, vo, p_)
                                          : materialized_vocab_footprint(vs, vo, p_);
    if (park) {
      const std::string ph = "final norm forward";
      persistent(ph, true, true);
      batch(ph, {bb_.x, bb_.y, bb_.rstd, fb_.norm_params});
      residents(ph, groups_);
      kept(ph, L_);
      kept_experts(ph, L_);
    }
    {
      const std::string ph = "loss forward";
      persistent(ph, true, true);
      if (fused)
        batch(ph, {bb_.x, y_dev, bb_.rstd, bb_.d_hn, fb_.norm_params});  // the normed hidden in x
      else
        batch(ph, {bb_.x, y_dev, bb_.rstd, fb_.norm_params});
      residents(ph, groups_);
      kept(ph, L_);
      kept_experts(ph, L_);
      add_phase(f_, ph, voc.phase(fused ? "forward_backward" : "forward"));
    }
    {
      const std::string ph = "loss backward";
      persistent(ph, true, true);
      batch(ph, {bb_.x, y_dev, bb_.rstd, bb_.d_hn, fb_.norm_params});
      residents(ph, groups_);
      kept(ph, L_);
      kept_experts(ph, L_);
      add_phase(f_, ph, voc.phase(fused ? "forward_backward" : "backward"));
    }
    // The held-out loss (Trainer::evaluate -> MoeTransformer::forward): after the layers'
    // forward, x, y (the normed hidden) and rstd beside the vocabulary loss's plain forward,
    // which a one-rank Ring-DTP group runs unfused (its block, lse and running statistics:
    // more than the fused block of a training step).
    if (in_.evaluates) {
      const std::string ph = "loss eval";
      persistent(ph, true);
      batch(ph, {bb_.x, bb_.y, bb_.rstd});
      const Footprint plain = fused ? ring_dtp_footprint(vs, vo, p_) : voc;
      add_phase(f_, ph, plain.phase("forward"));
    }
    {
      const std::string ph = "final norm backward";
      persistent(ph, true, true);
      if (park)  // y back, x freed, dy over d_hn a row tile at a time
        batch(ph, {bb_.y, bb_.rstd, bb_.d_hn, fb_.norm_params, fb_.norm_grads, bb_.norm_tile});
      else
        batch(ph, {bb_.x, bb_.y, bb_.rstd, bb_.d_hn, fb_.norm_params, fb_.norm_grads});  // dy into x's buffer
      residents(ph, groups_);
      kept(ph, L_);
      kept_experts(ph, L_);
    }
  }

  // ---- backward, layer by layer from the last: x (the one gradient buffer: every block's
  // backward runs in place on it); no mid (DecoderLayer::by_rows: the MLP's backward takes
  // it a row tile at a time from the attention's kept o)
  // With checkpoint groups: the group's recomputed inputs held so far (CheckpointBuffers::
  // recompute): block l's backward holds those of the blocks before it in its group, and
  // its recomputation those and its output.
  void backward_common(const std::string& ph, std::int64_t layer, bool recompute = false) {
    persistent(ph, true);
    batch(ph, {bb_.x});
    if (stacked_) f_.device(ph, cb_.grad, static_cast<u64>(cb_.grad_buffers));  // 0 in place
    residents(ph, group_of(layer));
    if (stacked_) f_.device(ph, cb_.boundary, static_cast<u64>(index_in_group(layer) + (recompute ? 1 : 0)));
  }
  // A layer's backward: its attention's forward, keeping o and lse (DecoderLayer,
  // forward_for_rows), the MLP's backward beside them with its input's row tile, the
  // attention's backward.
  void layer_backwards() {
    for (auto it = backward_mlps_.rbegin(); it != backward_mlps_.rend(); ++it) {
      const Mlp& m = mlps_.at(*it);
      backward_common(m.bwd, m.layer);
      add_phase(f_, m.bwd, m.layer_fp.phase("backward rows"));
      if (m.dispatch) add_phase(f_, m.bwd, m.dispatch_fp.phase("backward"));
      add_phase(f_, m.bwd, att_.phase(kAttentionRowsPhase));
      kept(m.bwd, m.layer);  // keep_attention: the earlier layers' too
      kept_experts(m.bwd, m.layer + 1);  // this layer's spent in its backward, freed as it returns
    }
    // The last layer's: forward_for_rows' recomputation (keep_attention: it reuses the kept
    // o and lse and runs no kernel; the earlier layers' are held beside; o on the host: its
    // o_tile taken beside k and v, "... output"), then the attention's backward taking what
    // that kept: the phases each call reaches (attention_call_phases), named by the call.
    // The recomputation runs before the last layer's MLP backward (its experts still
    // kept), the attention's backward after it.
    const auto add = [&](const std::string& ph, std::string_view part, bool before_mlp) {
      backward_common(ph, L_ - 1);
      add_phase(f_, ph, att_.phase(part));
      kept(ph, L_ - 1);
      kept_experts(ph, before_mlp ? L_ : L_ - 1);
    };
    const AttentionCall recompute =
        sch_.keep_attention ? AttentionCall::forward_reusing_kept : AttentionCall::forward_for_rows;
    for (const std::string_view part : attention_call_phases(T_, ac_, recompute))
      add("backward attention recompute" + std::string(forward_suffix(part)), part, true);
    for (const std::string_view part : attention_call_phases(T_, ac_, AttentionCall::backward_taking_kept))
      add("backward attention" + std::string(backward_suffix(part)), part, false);
  }
  // A checkpoint group's recomputation (CheckpointOptions::group_layers > 1), in the
  // stack's backward: its blocks but the last forward again (Block::forward_recompute),
  // each writing its output into a recompute buffer beside the group's earlier ones, the
  // attention's forward phases (the layer holding the most boundaries then) and the MLP's
  // with its dispatch (per kind; every MoE layer with its own sizes).
  void recomputations() {
    if (G_ <= 1 || L_ <= 1) return;
    const std::int64_t at = most_boundaries(std::nullopt, true);
    // keep_experts: a group's recomputation keeps nothing new; its layers' and the
    // earlier groups' kept experts are held through it.
    const auto through_group = [&](std::int64_t l) {
      const CheckpointGroup g = checkpoint_group(L_, G_, group_of(l));
      return g.first + g.count;
    };
    for (const std::string_view part : attention_call_phases(T_, ac_, AttentionCall::forward)) {
      const std::string ph = "recompute attention" + std::string(forward_suffix(part));
      backward_common(ph, at, true);
      add_phase(f_, ph, att_.phase(part));
      kept_experts(ph, through_group(at));
    }
    for (const std::int64_t l : recompute_mlps_) {
      const Mlp& m = mlps_.at(l);
      backward_common(m.rec, m.layer, true);
      add_phase(f_, m.rec, m.layer_fp.phase("forward"));
      if (m.dispatch) add_phase(f_, m.rec, m.dispatch_fp.phase("forward"));
      kept_experts(m.rec, through_group(m.layer));
    }
  }
  // The train footprint's name for an attention phase after the call's own ("forward
  // attention", "backward attention recompute"): its projections (or, for a forward that
  // reuses what keep-through kept, what it holds instead), its kernel, o_proj from the host.
  static std::string_view forward_suffix(std::string_view part) {
    if (part == kAttentionForwardPhases[1]) return "";
    if (part == kAttentionForwardOutputPhase) return " output";
    return " project";
  }
  // ... and after "backward attention": the reprojection beside what was kept, o_proj's
  // backward, the kernel's, the projections'.
  static std::string_view backward_suffix(std::string_view part) {
    if (part == kAttentionKeptProjectPhase) return " reproject";
    if (part == kAttentionBackwardPhases[0]) return " output";
    if (part == kAttentionBackwardPhases[2]) return " project";
    return "";
  }
  // The embedding's full gradient, after the layers (dx in x's buffer).
  void embedding_backward() {
    const std::string ph = "embedding backward";
    persistent(ph, true);
    batch(ph, {bb_.x, fb_.embed_grads});
    embedding_exchange(ph);
  }

  const TrainFootprintInputs& in_;
  const ModelConfig& c_;
  StoreGroups g_;
  const int cp_;
  const std::int64_t L_, H_;
  const ModelSchedules& sch_;
  const Precision p_;    // in.schedules.precision
  const u64 act_bytes_;  // activations and their gradients: 4 (f32) or 2 (bf16)
  std::int64_t T_ = 0;
  Footprint f_{"train"};
  FsdpBuffers fb_;
  std::vector<BufferSpec> resident_dev_;
  Footprint opt_{"optimizer"};
  ModelBatchBuffers bb_;
  bool stacked_ = false;
  CheckpointBuffers cb_;
  const std::int64_t G_ = sch_.checkpoint.group_layers;  // checkpoint groups of G_ blocks
  std::int64_t groups_ = 0;                                // ceil(L / G): the stack's boundaries
  std::int64_t ringed_ = 0;
  AttentionLayerConfig ac_;
  Footprint att_{"attention"};
  std::map<std::int64_t, Mlp> mlps_;  // by layer: the MLP sublayers whose moments are phases
  std::vector<BufferSpec> kept_experts_;  // by layer: its kept experts (size_kept_experts)
  // Their layers in the forward, the backward and a group's recomputation (plan_mlps).
  std::vector<std::int64_t> forward_mlps_, backward_mlps_, recompute_mlps_;
};

}  // namespace

Footprint train_footprint(const TrainFootprintInputs& in) { return TrainFootprintBuilder(in).build(); }

}  // namespace peakbound
