// MoeTransformer: a Qwen3-MoE / Mixtral decoder-only model (as Hugging Face
// transformers computes it) on one rank of a training run:
//   x = embed_tokens[ids]
//   for each layer: x = DecoderLayer(x)       (attention sublayer, then MoE or dense MLP)
//   h = norm(x);  loss = CE(h lm_head^T, targets)  + coef * aux
// The layers run under a CheckpointedStack (resident boundaries or SCO), the routed
// experts through MoeDispatch over the expert-parallel group (standard EP, LLEP or
// PipelinedLLEP), the head through VocabLoss over the vocabulary group (materialized
// or Ring-DTP): every schedule is a constructor option, the math is the same.
//
// Parameters: the non-expert, non-head tensors sharded FSDP-style over the world
// (train/fsdp_units.h: units gathered into two layer slots before each layer's forward
// and backward, gradients reduce-scattered into the shard after its backward), and two
// ParameterStores held in full (train/process_groups.h for the groups): `experts` (this
// rank's E/ep experts of every MoE layer, packed so each layer's experts are the one
// [E/ep, 3FH] block MoeDispatch reads) and `head` (this rank's lm_head rows).
// forward_backward ADDS this rank's partial gradients into the two stores (the trainer
// reduces them over each store's replica group) and the reduced ones into the FSDP shard.
//
// The load-balancing loss is transformers' load_balancing_loss_func over the whole
// micro-batch of the data-parallel world: every MoE layer's router counts and
// probability sums are summed over all ranks before the one loss (so a run on 4 ranks
// computes what transformers computes on the concatenated batch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/model/model_config.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/schedules/checkpoint_policy.h"
#include "peakbound/schedules/moe_plan.h"
#include "peakbound/schedules/vocab_loss.h"
#include "peakbound/train/parameter_store.h"
#include "peakbound/train/process_groups.h"

namespace peakbound {

struct MoeAuxState;
struct DispatchStats;
class CheckpointedStack;
class FsdpUnits;

// Tokens a rank's round of the vocabulary-parallel embedding holds at most by default
// (ModelSchedules::embedding_rows).
inline constexpr std::int64_t kEmbeddingRoundRows = 1024;

// Which schedule runs each peak (the optimizer's is the trainer's).
struct ModelSchedules {
  DispatchKind dispatch = DispatchKind::standard_ep;
  DispatchOptions dispatch_options;
  bool ring_dtp = false;  // false: the materialized vocab-parallel baseline
  VocabLossOptions vocab;
  CheckpointOptions checkpoint;  // schedule resident (baseline) or sco
  // The numeric mode (docs/precision.md): under bf16 every layer, the embedding, the final
  // norm, the head (vocab.precision is overridden by it), the batch buffers and the
  // checkpointed stack's boundaries are bf16, the parameters the model computes with are
  // bf16 (FSDP units, both stores), and the gradients, rstd and statistics stay f32.
  Precision precision = Precision::f32;
  // FSDP's gradient reduce-scatter on a thread of its own while the next layer's backward
  // runs (FsdpUnits::reduce_add_async; MPI with MPI_THREAD_MULTIPLE, the CPU device), the
  // same bits either way. Off by default: on CPU ranks a shared-memory transfer is a copy
  // by the same cores that compute, so there is nothing to hide it behind; the main job
  // gained nothing from it at 2 or 4 ranks on 2 cores (docs/training.md).
  bool fsdp_reduce_thread = false;
  // Selective recomputation of the attention: every layer's attention output o and its
  // log-sum-exp stay on the device from the forward to the layer's backward, whose
  // recomputation then runs the norm, the projections and RoPE but not the attention
  // kernel (or the ring). Costs L x (T x Hq x Dv activations + T x Hq f32) a rank, a
  // per-token term the checkpointed stack otherwise does not have; saves one attention
  // forward per layer per step (docs/training.md). The same bits either way. Off by default.
  bool keep_attention = false;
  // The routed experts' forward kept for their backward (MoeLayer::set_keep_experts):
  // every MoE layer's dispatch keeps gate, up, act and out of every row its rank's
  // experts compute, from the layer's forward to its backward, which then runs no expert
  // forward (3 of an expert row's 12 GEMMs a step). Costs every MoE layer's
  // dispatch_kept_buffer at once (~ T x top_k x (3F + H) activations a layer on a
  // balanced rank: a per-token term); the same bits either way. Off by default (train
  // keeps them while the plan fits its budget).
  bool keep_experts = false;
  // Every MoE and dense MLP sublayer over row tiles of at most this many tokens
  // (MoeLayerConfig::seq_tile): its per-token buffers hold one tile; 0: whole.
  // model_schedules sets kMoeTileRows under PipelinedLLEP (the schedule that bounds the
  // sublayer's dispatch bounds the rest of it too), 0 otherwise.
  std::int64_t moe_tile = 0;
  // Every attention sublayer's pieces (AttentionLayerConfig::piece_tokens): the ring's K/V
  // pieces and the queries' pieces of the forward and the backward (attention_query_pieces);
  // 0: whole. Tests take small ones.
  std::int64_t attention_piece = kRingPieceTokens;
  // Every attention sublayer's kernel shares (AttentionLayerConfig::threads): a workspace
  // slot each, run on that many threads on the CPU device. resolve_run sets the rank's
  // cores there (cpu_attention_threads, train/run.h); 1 elsewhere.
  int attention_threads = 1;
  // The vocabulary-parallel embedding (Megatron's VocabParallelEmbedding, for ranks that
  // hold different tokens): the embedding's rows sharded over the vocabulary group as the
  // head's are (in the head's store, reduced over its replicas), not an FSDP unit gathered
  // whole for the forward with a whole [V, H] f32 gradient in the backward. Each token's row
  // comes from the rank that holds it: rounds of at most embedding_rows tokens a rank, the
  // ids sent to their rows' owners and the rows sent back (all_to_all_v over the group), and
  // in the backward the row gradients sent to the owners, which add them into their shard
  // (model_embedding_buffers). The same rows; the gradient's sums in another order. CPU only.
  bool vocab_parallel_embedding = false;
  std::int64_t embedding_rows = kEmbeddingRoundRows;
};

// One micro-batch's sums on this rank.
struct BatchSums {
  double ce = 0;            // summed cross-entropy over this rank's valid targets
  std::int64_t tokens = 0;  // this rank's valid targets
  double aux = 0;           // coef x the load-balancing loss of the whole micro-batch (every rank the same)
};

// Where one rank sits in the groups ProcessGroups::split makes (sizes and ranks), as
// far as the parameter stores care: the expert store is reduced over ep_replicas, the
// head over vocab_replicas (the FSDP units over the world).
struct StoreGroups {
  int world = 1;
  int ep = 1, ep_rank = 0, ep_replicas = 1;
  int vocab = 1, vocab_rank = 0, vocab_replicas = 1;
  // Rank `rank` of `world` under `layout` (ProcessGroups::split's consecutive groups).
  static StoreGroups of(const ParallelLayout& layout, int world, int rank);
};

// One parameter store's selector and layout; the model's two (experts, head).
struct StoreSpec {
  ShardSelector select;
  LayoutOptions options;
};
struct ModelStoreSpecs {
  StoreSpec experts, head;
};
// The stores MoeTransformer builds for model c on rank g (InvalidArgument when ep does
// not divide E). The footprint calls parameter_store_buffers with the same specs.
// vocab_parallel_embedding: the head's store holds the embedding's rows of the vocabulary
// shard too (ModelSchedules::vocab_parallel_embedding).
ModelStoreSpecs model_store_specs(const ModelConfig& c, const StoreGroups& g, bool vocab_parallel_embedding = false);

// The vocabulary-parallel embedding's buffers for one call (forward or backward), in
// rounds of `rows` tokens a rank over a vocabulary group of P ranks, sized for the most
// any round can bring (every token of the group's round to one shard), Component::vocab:
//   ids [rows] i32, order [rows] i64     this rank's round: its ids by owner, and where each
//                                        token's row goes (forward) or comes from (backward)
//   recv_ids [P rows] i32                the ids the group's ranks ask of this shard
//   rows_out [P rows, H] (activations)   forward: their rows; backward: their gradients
//   rows_in [rows, H] (activations)      forward: this rank's rows back; backward: its
//                                        gradient rows by owner
struct ModelEmbeddingBuffers {
  BufferSpec ids, order, recv_ids, rows_out, rows_in;
};
// The rows of a round: embedding_rows, or fewer where no rank of the group has that many
// (most: the group's most tokens); 0 where none has any.
std::int64_t embedding_round_rows(std::int64_t most, std::int64_t embedding_rows);
ModelEmbeddingBuffers model_embedding_buffers(std::int64_t rows, int group, std::int64_t hidden, Precision p);

// Every decoder layer's attention sublayer config, with seq_len S (the whole sequence's),
// on rank cp_rank of a context-parallel group of cp ranks.
AttentionLayerConfig model_attention_config(const ModelConfig& c, std::int64_t S, int cp = 1, int cp_rank = 0,
                                            std::int64_t piece_tokens = kRingPieceTokens);

// The model's aux-loss state (Component::workspace, f32): counts, prob_sums, aux_grad
// [max(E, 1)] each and the loss [2] (the aux loss, the sequence-wise balance loss), held for
// the model's life.
struct ModelAuxBuffers {
  BufferSpec counts, prob_sums, aux_grad, loss;
};
ModelAuxBuffers model_aux_buffers(std::int64_t experts);

// DeepSeek-V3's router state (a model with router_score_correction; 0 bytes otherwise),
// f32 in both precisions, held for the model's life, M = the MoE layers:
//   correction [M, E] (Component::params)     each MoE layer's e_score_correction_bias, the
//                                              same on every rank (not FSDP-sharded: nothing
//                                              differentiates it)
//   loads [M, E] (Component::workspace)       token-copies per expert this rank routed since
//                                              the last update_router_bias
struct ModelRouterStateBuffers {
  BufferSpec correction, loads;
};
ModelRouterStateBuffers model_router_state_buffers(const ModelConfig& c);

// One micro-batch of T tokens of hidden H (x, y, d_hn in activation_dtype(p), rstd f32):
//   ids, targets [T] i32 (workspace)     the whole forward_backward
//   x [T, H] (layer)                      from the loss on: the final norm's output (the
//                                         loss's input), then the final norm's input
//                                         gradient, which the layers turn into dx in place
//                                         (the embedding writes straight into the stack's
//                                         first boundary; evaluation, and a rank without
//                                         tokens, embed into x)
//   y [T, H] (layer)                      the stack's output, until the final norm's backward
//   rstd [T] (layer)                      the final norm's rstd
//   d_hn [T, H] (layer)                   the loss's input gradient
//   y_host [T, H] (host, checkpoints)     parks_final_hidden: y across the loss (the
//                                         stack allocates it with its ring, once)
//   norm_tile [min(T, 1024), H] (layer)   parks_final_hidden: the final norm's backward
//                                         a row tile at a time, written over d_hn, which
//                                         then is the layers' gradient buffer (no x)
// forward() (evaluation) uses y as the second residual buffer and rstd.
// seq_counts, seq_psum: the sequence-wise balance loss's statistics (seq_aux_floats each,
// f32; 0 bytes when it is off), held through the pass like ids and targets.
struct ModelBatchBuffers {
  BufferSpec ids, targets, x, y, rstd, d_hn, seq_counts, seq_psum, y_host, norm_tile;
};
// Rows of the final norm's backward tile (norm_tile).
inline constexpr std::int64_t kFinalNormTileRows = 1024;
// SCO's one-slot ring (prefetch_depth 0, what the budget chooses when two slots do not
// fit) parks the final hidden y on the host across the loss too: from the final norm's
// forward to its backward the device holds the normed hidden, d_hn and the ring's one
// boundary, not y beside them (one [T, H] a rank less at the loss), for one more copy
// each way a step (the H2D exposed, as the one-slot ring's are).
// The ring's one slot goes to the host across the loss too (CheckpointedStack::park_slot:
// the last ringed layer's input, which the one-slot ring otherwise holds on the device
// from the stack's forward to its backward), when the placement has one.
inline bool parks_final_hidden(const ModelSchedules& s) {
  return s.checkpoint.schedule == CheckpointSchedule::sco && s.checkpoint.prefetch_depth == 0;
}
// Whether a stack placed as `p` under parks_final_hidden parks its slot too (one slot
// and a ringed boundary in it; a placement keeping every boundary resident has none).
inline bool parks_slot(const CheckpointPlacement& p) { return p.ring_slots == 1 && p.ringed() > 0; }
// With it (and without keep_attention, which holds every layer's o on the device) every
// attention sublayer's output o lives on the host between the kernel that writes it and
// o_proj's reads (AttentionLayerConfig::output_on_host; query pieces only): the device
// holds no [T, Hq Dv] beside the forward's k and v, nor through the MLP's backward, and
// o_proj's backward brings it back a query piece at a time before k and v are projected
// again. One host area of [T, Hq Dv] for all layers (allocated with the stack); one copy of
// o each way a layer forward and three in its backward (the recomputation's out, the rows'
// and o_proj's back).
inline bool offloads_attention_output(const ModelSchedules& s) {
  return parks_final_hidden(s) && !s.keep_attention;
}
// Throws InvalidArgument for schedules the model refuses: checkpoint options out of range
// (validate_checkpoint_options), and keep_attention with checkpoint groups of several
// layers (a group's recomputation runs its blocks' attention forward again: nothing of the
// first forward's would be read), and embedding_rows below 1.
void check_model_schedules(const ModelSchedules& s);
ModelBatchBuffers model_batch_buffers(std::int64_t tokens, std::int64_t hidden, Precision p = Precision::f32,
                                      std::int64_t seq_aux_floats = 0);
// [MoE layers, sequences, E] when c.seq_aux_loss_coef > 0 (a rank's `sequences` per pass), else 0.
std::int64_t seq_aux_floats(const ModelConfig& c, std::int64_t sequences);

// Throws InvalidArgument naming the first feature of `c` the trainer does not
// implement (a config.json setting in c.unmodelled, such as a non-SiLU hidden_act or RoPE
// scaling; MLA, router or MLP biases outside gpt-oss, the aux loss with sigmoid routing,
// tied embeddings, several unmerged shared experts).
void check_trainable(const ModelConfig& c);

class MoeTransformer {
 public:
  // Collective over groups.world (the dispatch and vocabulary groups are set up here).
  MoeTransformer(Device& dev, HostMemory& host, ProcessGroups& groups, const ModelConfig& config,
                 const ModelSchedules& schedules);
  ~MoeTransformer();
  MoeTransformer(const MoeTransformer&) = delete;
  MoeTransformer& operator=(const MoeTransformer&) = delete;

  const ModelConfig& config() const { return config_; }
  const TensorTable& table() const { return table_; }
  const ModelSchedules& schedules() const { return schedules_; }
  ProcessGroups& groups() { return groups_; }
  // The non-expert, non-head parameters, sharded FSDP-style over the world.
  FsdpUnits& fsdp() { return *fsdp_; }
  ParameterStore& experts() { return *experts_; }
  ParameterStore& head() { return *head_; }
  // The two stores held in full per rank (experts, head), with the group each store's
  // gradients are summed over (the FSDP units reduce their own, layer by layer).
  std::vector<ParameterStore*> stores() { return {experts_.get(), head_.get()}; }
  std::vector<Communicator*> store_groups() { return {groups_.ep_replicas.get(), groups_.vocab_replicas.get()}; }

  // Deterministic initialisation from a seed, independent of the layout: every
  // element's value is a function of (seed, tensor name, index), so any layout holds
  // the same model. Linear and embedding weights N(0, initializer_range), RMSNorm
  // weights 1. Under bf16 the fp32 values (the same an f32 model gets) become the FSDP
  // units' and stores' pending masters (set_pending_master, for the Trainer's master)
  // and the device holds to_bf16 of them.
  void init_parameters(std::uint64_t seed);
  // The weights of a Hugging Face model directory (train/hf_checkpoint.h); under bf16,
  // as init_parameters: fp32 pending masters on the host, to_bf16 of them on the device.
  void load_hf(const std::string& dir);
  void zero_grads();

  // Forward and backward of `sequences` sequences of S tokens held by this rank
  // (ids, targets: host arrays of sequences x S; targets equal to the vocab loss's
  // ignore_index are not scored; sequences may be 0). Under context parallelism every
  // rank of a cp group passes the same sequences (checked) and computes on its zigzag
  // shard of each (InvalidArgument when S < 2 cp). The cross-entropy's gradient is
  // scaled by ce_scale (1 / the step's valid targets over the world), the aux loss's by
  // aux_scale (1 / micro-batches). Adds into the stores' gradients. Collective.
  BatchSums forward_backward(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                             std::int64_t S, float ce_scale, float aux_scale);
  // The forward alone (evaluation): nothing kept, no gradient. Collective.
  BatchSums forward(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences, std::int64_t S);

  // DeepSeek-V3's auxiliary-loss-free balancing (its report, section 2.1.2), after each
  // optimizer step: every MoE layer's loads are summed over the world (every rank's tokens
  // of every micro-batch since the last call) and its correction bias moves by
  // speed * sign(mean load - load) per expert (ops::moe_router_bias_update); the loads are
  // then zeroed. speed 0 only zeroes them. No-op without router_score_correction.
  // Collective over the world.
  void update_router_bias(float speed);
  // This rank's loads since the last update_router_bias, [MoE layers, E] f32 on the device
  // (CPU: readable in place); null without router_score_correction.
  const float* router_loads() const { return loads_.bytes() > 0 ? loads_.as<float>() : nullptr; }
  // The router buffers (is_router_buffer: e_score_correction_bias), each whole [E] f32 on
  // the device, with their checkpoint names, in table order (empty without them).
  std::vector<std::pair<std::string, float*>> router_buffers();

  // Every MoE layer's dispatch statistics of its last pass, in layer order.
  std::vector<const DispatchStats*> dispatch_stats() const;

  // The checkpointed stack of the last forward_backward (null before one).
  const CheckpointedStack* stack() const { return stack_.get(); }

 private:
  struct Layer;
  struct Pass;
  class FsdpBlock;
  // The pass's tokens on the device, their checks, the statistics zeroed (no x yet).
  void prepare(Pass& p, const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences, std::int64_t S);
  // The bodies over the activation type A (float | bf16), dispatched on the precision.
  // embed: x = table[ids] into out [T, H] (the stack's first boundary, or the pass's x).
  template <class A>
  void embed(Pass& p, A* out);
  // The vocabulary-parallel embedding (ModelSchedules::vocab_parallel_embedding): forward
  // out [T, H] = the rows of p's ids; backward adds dx's rows into the store's gradient
  // of the shard's rows. Collective over the vocabulary group.
  template <class A>
  void embed_exchange(Pass& p, A* out, const A* dx, bool backward);
  template <class A>
  BatchSums forward_backward_as(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                                std::int64_t S, float ce_scale, float aux_scale);
  template <class A>
  BatchSums forward_as(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences, std::int64_t S);
  void init_bf16(std::uint64_t seed);
  void load_hf_bf16(const std::string& dir);
  // This rank's FSDP shard of a Hugging Face checkpoint, on the host (both precisions' loads).
  std::vector<float> hf_fsdp_shard(const std::string& dir) const;
  bool same_sequences(const std::int32_t* ids, const std::int32_t* targets, std::int64_t sequences,
                      std::int64_t S) const;
  void finish_aux(Pass& p, float aux_scale, bool want_grad);
  void finish_seq_aux(Pass& p, float aux_scale, bool want_grad);
  BatchSums batch_sums(const LossSum& ls, const Pass& p) const;
  Tensor view(ParameterStore& s, const std::string& name, bool grad) const;
  Tensor slot_view(std::int64_t layer, const std::string& name, bool grad) const;

  Device& dev_;
  HostMemory& host_;
  ProcessGroups& groups_;
  ModelConfig config_;
  TensorTable table_;
  ModelSchedules schedules_;
  std::unique_ptr<FsdpUnits> fsdp_;
  Buffer param_slots_[2], grad_slots_[2];  // the gathered layer units: layer l uses slot l % 2
  std::unique_ptr<ParameterStore> experts_, head_;
  ModelStoreSpecs store_specs_;  // the selectors the stores were built with (load_hf under bf16)
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<VocabLoss> vocab_loss_;
  Buffer counts_, prob_sums_, aux_grad_, aux_loss_;
  double seq_loss_ = 0.0;  // the last pass's sequence-wise balance loss (the world's, set by finish_aux)
  Buffer correction_, loads_;  // model_router_state_buffers
  std::vector<std::string> router_buffer_names_;  // correction_'s rows, one per MoE layer
  std::unique_ptr<MoeAuxState> aux_state_;
  std::unique_ptr<CheckpointedStack> stack_;
  Buffer y_host_;  // parks_final_hidden: y across the loss (with the stack, for its tokens)
  // parks_final_hidden with the one-slot ring: the slot's boundary across the loss.
  Buffer slot_host_;
  // offloads_attention_output: the layers' o (reserved with the stack, for its tokens).
  AttentionOutputHost out_host_;
  std::int64_t stack_tokens_ = -1;
  std::int64_t moe_layers_ = 0;
};

}  // namespace peakbound
