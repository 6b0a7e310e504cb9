#include "peakbound/train/train_footprint.h"

#include <algorithm>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/layers/decoder_layer.h"
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
constexpr u64 kF32 = 4;  // the runtime's activations and parameters

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
  }
  return m;
}

Footprint train_footprint(const TrainFootprintInputs& in) {
  const ModelConfig& c = in.model;
  check_trainable(c);
  const StoreGroups g = StoreGroups::of(in.layout, in.world, in.rank);
  if (!in.rank_sequences.empty() && static_cast<int>(in.rank_sequences.size()) != in.world)
    throw InvalidArgument("train footprint: rank_sequences has " + std::to_string(in.rank_sequences.size()) +
                          " entries for " + std::to_string(in.world) + " ranks");
  auto sequences_of = [&](int r) {
    return in.rank_sequences.empty() ? in.sequences : in.rank_sequences[static_cast<std::size_t>(r)];
  };
  // Context parallel: rank r is rank r % cp of its group and holds its zigzag shard of
  // each sequence (the group's ranks bring the same sequences).
  const int cp = static_cast<int>(in.layout.cp);
  if (cp > 1 && in.seq_len < 2 * static_cast<std::int64_t>(cp))
    throw InvalidArgument("train footprint: context parallel over " + std::to_string(cp) +
                          " ranks needs seq_len >= " + std::to_string(2 * cp) + ", got " + std::to_string(in.seq_len));
  auto tokens_of = [&](int r) {
    const std::int64_t n = sequences_of(r);
    if (n < 0 || in.seq_len < 1) throw InvalidArgument("train footprint: need sequences >= 0 and seq_len >= 1");
    const std::int64_t local = cp > 1 ? zigzag_shard(in.seq_len, cp, r % cp).tokens() : in.seq_len;
    return static_cast<std::int64_t>(checked_mul(static_cast<u64>(n), static_cast<u64>(local), "train footprint tokens"));
  };
  const std::int64_t L = c.num_layers, H = c.hidden_size;
  const std::int64_t T = tokens_of(in.rank);
  const ModelSchedules& sch = in.schedules;
  Footprint f("train");

  // ---- persistent: stores, shards, optimizer, aux, checkpoint ring / host boundaries
  const TensorTable table(c);
  const ModelStoreSpecs specs = model_store_specs(c, g);
  // The FSDP units (train/fsdp_units.h): shards, reduce scratch, the two layer slots of
  // parameters and of gradients, all held for the model's life.
  const FsdpBuffers fb = fsdp_buffers(table, g.world);
  std::vector<BufferSpec> resident_dev = {fb.params_shard, fb.grads_shard, fb.scratch,
                                          fb.layer_params, fb.layer_params, fb.layer_grads, fb.layer_grads};
  u64 shard = fb.params_shard.bytes / kF32;
  const StoreSpec* stores[2] = {&specs.experts, &specs.head};
  const int group_size[2] = {g.ep_replicas, g.vocab_replicas};
  for (int i = 0; i < 2; ++i) {
    const ParameterLayout lay = parameter_layout(table, stores[i]->select, stores[i]->options);
    const ParameterStoreBuffers b = parameter_store_buffers(lay, kF32);
    resident_dev.push_back(b.params);
    resident_dev.push_back(b.grads);
    shard = checked_add(shard, lay.elements / static_cast<u64>(group_size[i]), "trainer shard");
  }
  const TrainerShardBuffers sb = trainer_shard_buffers(shard);
  resident_dev.push_back(sb.params);
  resident_dev.push_back(sb.grads);
  const ModelAuxBuffers ab = model_aux_buffers(c.num_experts);
  for (const BufferSpec& s : {ab.counts, ab.prob_sums, ab.aux_grad, ab.loss}) resident_dev.push_back(s);
  const Footprint opt = optimizer_footprint(
      in.optimizer,
      optimizer_shape(ParamShard{nullptr, DType::f32, nullptr, DType::f32, static_cast<std::int64_t>(shard)}),
      in.optimizer_options);

  // The stack (built on the first step with tokens).
  const bool stacked = T > 0;
  CheckpointBuffers cb;
  if (stacked) cb = checkpoint_buffers(L, checked_mul(static_cast<u64>(T), static_cast<u64>(H), "[T, H]"), kF32,
                                       sch.checkpoint);
  const std::int64_t M = stacked ? cb.placement.ringed() : L;

  // Everything held from the trainer's construction on, plus the stack's ring and host
  // boundaries once it exists.
  auto persistent = [&](const std::string& phase, bool with_stack) {
    for (const BufferSpec& s : resident_dev) f.device(phase, s);
    add_phase(f, phase, opt.phase("step"));
    if (with_stack && stacked) {
      f.device(phase, cb.boundary, static_cast<u64>(cb.placement.ring_slots));
      f.host(phase, cb.host_boundary, static_cast<u64>(cb.placement.offloaded));
    }
  };
  // Resident boundaries live while block l runs forward (acquired up to l + 1) or
  // backward (freed once their block's backward is done).
  auto residents = [&](const std::string& phase, std::int64_t live_through) {
    if (!stacked) return;
    const std::int64_t n = std::max<std::int64_t>(0, std::min(live_through, L - 1) - M + 1);
    f.device(phase, cb.boundary, static_cast<u64>(n));
  };
  const ModelBatchBuffers bb = model_batch_buffers(T, H);
  auto batch = [&](const std::string& phase, std::initializer_list<BufferSpec> live) {
    f.device(phase, bb.ids);
    f.device(phase, bb.targets);
    for (const BufferSpec& s : live) f.device(phase, s);
  };

  // ---- optimizer load: the trainer's constructor
  {
    const std::string ph = "optimizer load";
    for (const BufferSpec& s : resident_dev) f.device(ph, s);
    add_phase(f, ph, opt.phase("load"));
  }

  // ---- layers
  const AttentionLayerConfig ac = model_attention_config(c, in.seq_len, cp, in.rank % cp);
  const Footprint att = attention_layer_footprint(T, ac, kF32);
  const DecoderLayerBuffers db = decoder_layer_buffers(T, H, kF32);
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::int64_t last_dense = -1, last_moe = -1;
  for (std::int64_t l = 0; l < L; ++l) (c.is_moe_layer(l) ? last_moe : last_dense) = l;
  const std::int64_t last = L - 1;

  // The embedding, gathered for its forward (every step, before the layers).
  {
    const std::string ph = "embedding forward";
    persistent(ph, true);
    batch(ph, {bb.x});
    f.device(ph, fb.embed_params);
  }
  // Forward, the last layer's attention sublayer (every layer's is the same size).
  {
    const std::string ph = "forward attention";
    persistent(ph, true);
    batch(ph, {bb.x, bb.y});
    residents(ph, last + 1);
    f.device(ph, db.mid);
    add_phase(f, ph, att.phase("forward"));
  }
  // The MLP sublayers whose moments are phases: the last dense layer and the last MoE
  // layer, or every MoE layer when each has its own measured dispatch sizes.
  std::int64_t moe_count = 0;
  for (std::int64_t l = 0; l < L; ++l) moe_count += c.is_moe_layer(l) ? 1 : 0;
  if (!in.dispatch_layers.empty() && static_cast<std::int64_t>(in.dispatch_layers.size()) != moe_count)
    throw InvalidArgument("train footprint: dispatch_layers has " + std::to_string(in.dispatch_layers.size()) +
                          " entries for " + std::to_string(moe_count) + " MoE layers");
  struct Mlp {
    std::int64_t layer;
    std::string fwd, bwd;
    Footprint layer_fp, dispatch_fp;
    bool dispatch = false;
  };
  std::vector<Mlp> mlps;
  // The estimate sizes the exchange for the expert group's largest source (every rank of
  // the group sizes its rounds alike): the most tokens any rank of the group holds
  // (ProcessGroups::split's consecutive groups; ranks differ under cp or uneven batches).
  std::int64_t ep_tokens = 0;
  for (int r = in.rank - g.ep_rank; r < in.rank - g.ep_rank + g.ep; ++r) ep_tokens = std::max(ep_tokens, tokens_of(r));
  // No routing loads a rank with more than every source's tokens at min(k, E/EP) copies
  // each: the skew the layout allows at most (the planner's worst, plan_shapes).
  double skew = in.skew;
  if (c.num_experts > 0 && c.top_k > 0)
    skew = std::min(skew, std::max(1.0, static_cast<double>(g.ep) *
                                            static_cast<double>(std::min<std::int64_t>(c.top_k, c.num_experts / g.ep)) /
                                            static_cast<double>(c.top_k)));
  for (std::int64_t l = 0, moe_index = 0; l < L; ++l) {
    const bool moe = c.is_moe_layer(l);
    const std::int64_t i = moe ? moe_index++ : -1;
    const bool every = moe && !in.dispatch_layers.empty();
    if (l != (moe ? last_moe : last_dense) && !every) continue;
    const MoeLayerConfig mc = moe_layer_config(c, l, eps, sch.dispatch, sch.dispatch_options);
    Mlp m;
    m.layer = l;
    const std::string kind = moe ? "mlp" : "dense mlp";
    const std::string suffix = l == (moe ? last_moe : last_dense) ? "" : " (layer " + std::to_string(l) + ")";
    m.fwd = "forward " + kind + suffix;
    m.bwd = "backward " + kind + suffix;
    m.layer_fp = moe_layer_footprint(T, mc, kF32);
    if (moe) {
      const MoeShape shape = moe_layer_dispatch_shape(mc);
      DispatchSizes ds = every          ? in.dispatch_layers[static_cast<std::size_t>(i)]
                               : in.dispatch ? *in.dispatch
                                             : dispatch_sizes_estimate(sch.dispatch, shape, g.ep, ep_tokens, skew,
                                                                       sch.dispatch_options);
      if (!every && !in.dispatch) ds.tokens = T;  // its host scratch is this rank's own
      m.dispatch_fp = dispatch_footprint(shape, ds, kF32);
      m.dispatch = true;
    }
    mlps.push_back(std::move(m));
  }
  for (const Mlp& m : mlps) {
    persistent(m.fwd, true);
    batch(m.fwd, {bb.x, bb.y});
    residents(m.fwd, m.layer + 1);
    f.device(m.fwd, db.mid);
    add_phase(f, m.fwd, m.layer_fp.phase("forward"));
    if (m.dispatch) add_phase(f, m.fwd, m.dispatch_fp.phase("forward"));
  }

  // ---- final norm and the vocabulary loss
  // The vocabulary group: ranks [first, first + vocab) (ProcessGroups::split's consecutive groups).
  VocabLossShape vs;
  vs.dims = VocabDims{c.vocab_size, H};
  vs.rank = g.vocab_rank;
  const int first = in.rank - g.vocab_rank;
  for (int r = first; r < first + g.vocab; ++r) vs.tokens.push_back(tokens_of(r));
  // A one-rank group under Ring-DTP runs the fused forward_backward: d_hn is allocated
  // first and one phase of the loss holds it with the fused block (both phases below).
  const bool fused = sch.ring_dtp && ring_dtp_fuses(vs);
  const Footprint voc = fused         ? ring_dtp_step_footprint(vs, sch.vocab, kF32)
                        : sch.ring_dtp ? ring_dtp_footprint(vs, sch.vocab, kF32)
                                       : materialized_vocab_footprint(vs, sch.vocab, kF32);
  {
    const std::string ph = "loss forward";
    persistent(ph, true);
    if (fused)
      batch(ph, {bb.x, bb.y, bb.hn, bb.rstd, bb.d_hn, fb.norm_params});
    else
      batch(ph, {bb.x, bb.y, bb.hn, bb.rstd, fb.norm_params});
    residents(ph, L);
    add_phase(f, ph, voc.phase(fused ? "forward_backward" : "forward"));
  }
  {
    const std::string ph = "loss backward";
    persistent(ph, true);
    batch(ph, {bb.x, bb.y, bb.hn, bb.rstd, bb.d_hn, fb.norm_params});
    residents(ph, L);
    add_phase(f, ph, voc.phase(fused ? "forward_backward" : "backward"));
  }
  // The held-out loss (Trainer::evaluate -> MoeTransformer::forward): after the layers'
  // forward, x, y (the normed hidden) and rstd beside the vocabulary loss's plain forward,
  // which a one-rank Ring-DTP group runs unfused (its block, lse and running statistics:
  // more than the fused block of a training step).
  if (in.evaluates) {
    const std::string ph = "loss eval";
    persistent(ph, true);
    batch(ph, {bb.x, bb.y, bb.rstd});
    const Footprint plain = fused ? ring_dtp_footprint(vs, sch.vocab, kF32) : voc;
    add_phase(f, ph, plain.phase("forward"));
  }
  {
    const std::string ph = "final norm backward";
    persistent(ph, true);
    batch(ph, {bb.x, bb.y, bb.rstd, bb.d_hn, bb.dy, fb.norm_params, fb.norm_grads});
    residents(ph, L);
  }

  // ---- backward, layer by layer from the last: x, dy, the gradient ping-pong, mid, d_mid
  auto backward_common = [&](const std::string& ph, std::int64_t layer) {
    persistent(ph, true);
    batch(ph, {bb.x, bb.dy});
    if (stacked) f.device(ph, cb.grad, static_cast<u64>(cb.grad_buffers));
    residents(ph, layer);
    f.device(ph, db.mid);
    f.device(ph, db.d_mid);
  };
  for (auto it = mlps.rbegin(); it != mlps.rend(); ++it) {
    backward_common(it->bwd, it->layer);
    add_phase(f, it->bwd, it->layer_fp.phase("backward"));
    if (it->dispatch) add_phase(f, it->bwd, it->dispatch_fp.phase("backward"));
  }
  {
    const std::string ph = "backward attention recompute";
    backward_common(ph, last);
    add_phase(f, ph, att.phase("forward"));
  }
  {
    const std::string ph = "backward attention";
    backward_common(ph, last);
    add_phase(f, ph, att.phase("backward"));
  }

  // ---- the embedding's full gradient, after the layers (dx in x's buffer, dy still held)
  {
    const std::string ph = "embedding backward";
    persistent(ph, true);
    batch(ph, {bb.x, bb.dy, fb.embed_grads});
  }

  // ---- the optimizer step
  persistent("optimizer", true);
  return f;
}

}  // namespace peakbound
