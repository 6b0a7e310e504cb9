// MoeLayer: the second half of a decoder layer (the FFN sublayer with its pre-norm and
// residual) as transformers computes it, f32 or bf16 (MoeLayerConfig::precision), through
// ops:: on the device's compute stream. Two variants:
//   MoE (Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock, Qwen2-MoE / DeepSeek shared experts):
//     h      = rmsnorm(x) * w_post                        (post_attention_layernorm)
//     logits = h W_gate^T [T, E]; probs = softmax; ids, weights = top-k (renormalised
//              with norm_topk_prob)                       (layers/moe_router.h)
//     routed = sum_k weights[t,k] * SwiGLU_{ids[t,k]}(h[t])  (MoeDispatch over the EP group)
//     shared = SwiGLU_shared(h)                           (S shared experts of width Fs are
//              one SwiGLU of width S*Fs: gate/up rows and down columns concatenated, as
//              DeepSeek stores them); Qwen2-MoE: shared *= sigmoid(h W_sg^T)
//     y      = x + routed + shared
//   dense (leading dense layers, mlp_only_layers):  y = x + SwiGLU(rmsnorm(x) * w_post)
// Parameters are views into memory the caller owns (a parameter store). Backward
// recomputes everything from x (activation checkpointing: the norm, the router, the
// shared experts; MoeDispatch::backward re-runs the routed experts from h), writes dx
// and ADDS INTO every parameter gradient, this rank's expert gradients included.
// Every internal buffer comes from moe_layer_buffers (Component::layer), allocated per
// call; the dispatch's own buffers are its footprint's (schedules/moe_footprint.h).
//
// bf16 (mixed precision, docs/precision.md): x, y, dx, dy, h, the side SwiGLU's gate/up/
// act, shared_out and dh are bf16, and so are the parameters (w_post, w_gate, experts,
// the shared or dense SwiGLU, shared_expert_gate); every parameter gradient is fp32
// (gemm_bf16 beta 1, rmsnorm's fp32 dweight, the dispatch's fp32 expert gradients).
// Statistics stay fp32: rstd, the router's logits/probs (one gemm_bf16 straight into
// them), ids, weights and d_weights, and the shared gate's logit z (its gemm_bf16's C).
// Roundings: y = bf16(bf16(routed + x) + shared) (the side SwiGLU's down product is added
// through nn/linear, one rounding; the gated path's row_gate adds in one); dh takes the
// routed dx (written by the dispatch), then adds the router's d_logits16 W_gate, the
// gate's dz W_sg and the side SwiGLU's dx, each through nn/linear add mode: one rounding
// per contribution. The fp32 tile all of them share is MoeLayerBuffers::tile.
//
// Collective: forward and backward of an MoE layer call MoeDispatch, a collective over
// the expert-parallel group: every rank of the group calls them the same number of
// times in the same order, also with T = 0 tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/buffer.h"
#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"
#include "peakbound/nn/block.h"
#include "peakbound/layers/moe_router.h"
#include "peakbound/nn/swiglu_ffn.h"
#include "peakbound/model/model_config.h"
#include "peakbound/schedules/moe_dispatch.h"

namespace peakbound {

// Rows per tile of the side SwiGLU by default (MoeLayerConfig::side_tile): [512, F]
// intermediates keep the GEMMs large enough to run at speed.
inline constexpr std::int64_t kSideFfnTileRows = 512;

// The rows of one side-SwiGLU tile on T tokens: min(T, tile), T when tile is 0.
inline std::int64_t side_ffn_tile_rows(std::int64_t tokens, std::int64_t tile) {
  return tile > 0 && tile < tokens ? tile : tokens;
}

// Rows per tile of the whole sublayer under PipelinedLLEP by default
// (ModelSchedules::moe_tile -> MoeLayerConfig::seq_tile): [1024, H] activations, and a
// dispatch of 1024 x K copies a source, about what one PipelinedLLEP round of its default
// cap carries at top-2 to 4 anyway.
inline constexpr std::int64_t kMoeTileRows = 1024;

// The tile a run takes by default under dispatch kind k (ModelSchedules::moe_tile, and
// the analytic plan's MLP term): kMoeTileRows under PipelinedLLEP, 0 (whole) otherwise.
inline std::int64_t default_moe_tile(DispatchKind k) {
  return k == DispatchKind::pipelined_llep ? kMoeTileRows : 0;
}

// The rows a rank's sublayer tile holds on T tokens: min(T, tile), T when tile is 0.
inline std::int64_t moe_tile_rows(std::int64_t tokens, std::int64_t tile) { return side_ffn_tile_rows(tokens, tile); }
// The row tiles a sublayer runs on T tokens: ceil(T / tile), at least 1; 1 when tile is 0.
// (An MoE layer's group runs as many as its rank with the most tokens: MoeLayer::tile_count.)
inline std::int64_t moe_tile_count(std::int64_t tokens, std::int64_t tile) {
  return tile > 0 ? std::max<std::int64_t>(1, (tokens + tile - 1) / tile) : 1;
}

// The sublayer's sizes (HF config: hidden_size, moe_intermediate_size, num_experts,
// num_experts_per_tok, norm_topk_prob, n_shared_experts / shared_expert_intermediate_size,
// rms_norm_eps; intermediate_size for a dense layer).
struct MoeLayerConfig {
  std::int64_t hidden = 0;   // H
  // dense_ffn > 0: the dense sublayer (SwiGLU of that width); every MoE field below is
  // then ignored and no communicator call is made.
  std::int64_t dense_ffn = 0;
  std::int64_t ffn = 0;      // F, one routed expert's width
  std::int64_t experts = 0;  // E routed experts, divisible by the EP group's size
  std::int64_t top_k = 0;    // K, 1 <= K <= E
  bool norm_topk_prob = true;
  // softmax (Qwen, Mixtral, gpt-oss) or sigmoid (DeepSeek-V3, Kimi-K2: group-limited over
  // n_group groups keeping topk_group, weights times routed_scaling; layers/moe_router.h).
  RouterScoring scoring = RouterScoring::softmax;
  std::int64_t n_group = 1, topk_group = 1;
  float routed_scaling = 1.0f;
  // DeepSeek-V3's e_score_correction_bias [E] (sigmoid only): added to the scores for the
  // choice only, read from MoeLayerTensors::correction; not trained by gradients.
  bool score_correction = false;
  std::int64_t shared_experts = 0;  // S >= 0 (0: Qwen3-MoE, Mixtral)
  std::int64_t shared_ffn = 0;      // Fs, one shared expert's width (> 0 when S > 0)
  bool shared_gate = false;         // Qwen2-MoE's shared_expert_gate; needs S > 0
  // gpt-oss: the router Linear's bias [E] (logits = h W_gate^T + b), the routed experts'
  // biases and clamped SwiGLU (MoeShape bias / clamp: each expert [W_gate | W_up | W_down |
  // b_gate | b_up | b_down]). The clamp applies when clamped is set.
  bool router_bias = false;
  bool expert_bias = false;
  bool clamped = false;
  ops::SwigluClamp clamp{};
  float rms_eps = 1e-6f;
  // The side SwiGLU (dense MLP or shared experts) runs over row tiles of at most this
  // many tokens, so its [tile, side_ffn] intermediates stop growing with the context
  // (Arctic's TiledMLP; the tokens are independent, so only the weight gradients'
  // summation order changes). 0: all rows at once.
  std::int64_t side_tile = kSideFfnTileRows;
  // The whole sublayer (norm, router, routed and shared experts, residual) over row tiles
  // of at most this many tokens, forward and backward, so that none of its per-token
  // buffers (h, dh, the router's probabilities, ids and weights, the shared output) grows
  // with the context past a tile; 0: all rows at once. Tokens are independent here, so
  // only the order of the sums across tiles moves (the weight gradients, the router's
  // statistics). An MoE layer's tiles are collective: the expert-parallel group agrees on
  // the number of tiles (ceil of its largest rank's tokens over the tile, one all-reduce
  // a call), and a rank out of tokens joins the later tiles' dispatch with none.
  std::int64_t seq_tile = 0;
  DispatchKind kind = DispatchKind::standard_ep;
  DispatchOptions dispatch;
  // Which MoE layer of the model this is (0, 1, ...): its slice of MoeAuxState's
  // per-layer statistics.
  std::int64_t moe_index = 0;
  // The activation and parameter precision (the dispatch's too); f32 by default.
  Precision precision = Precision::f32;

  bool dense() const { return dense_ffn > 0; }
  // The one SwiGLU beside the routed experts: S * Fs (MoE), dense_ffn (dense).
  std::int64_t side_ffn() const { return dense() ? dense_ffn : shared_experts * shared_ffn; }
};

// Throws InvalidArgument naming the first bad field.
void check_moe_layer_config(const MoeLayerConfig& c);

// The sublayer of decoder layer `layer` of model m (rms_eps: the HF config's
// rms_norm_eps, which ModelConfig does not carry): MoE when m.is_moe_layer(layer), else
// dense of dense_intermediate_size. Throws InvalidArgument, naming the field, for what
// this layer does not compute: mlp_bias on a dense MLP or shared experts, a dense layer
// without dense_intermediate_size.
MoeLayerConfig moe_layer_config(const ModelConfig& m, std::int64_t layer, float rms_eps, DispatchKind kind,
                                const DispatchOptions& options);

// The routed experts' shape, for dispatch_footprint / dispatch_sizes_estimate
// (schedules/moe_footprint.h), which size the dispatch's own buffers. MoE configs only.
MoeShape moe_layer_dispatch_shape(const MoeLayerConfig& c);

// Views of the parameters (param_dtype(precision)) or of their gradients (f32 always) on
// the layer's device, nn.Linear layout (out x in). Leave empty what the variant does not use.
//   w_post        [H]                     post_attention_layernorm.weight (both variants)
//   w_gate        [E, H]                  the router (MoE)
//   w_gate_bias   [E]                     the router's bias (router_bias)
//   experts       (E/EP) x EF elements    this rank's experts e = rank*E/EP + i, each
//                                         [W_gate F,H | W_up F,H | W_down H,F] contiguous,
//                                         EF = 3FH, with expert_bias then [b_gate F | b_up F |
//                                         b_down H]: EF = 3FH + 2F + H
//                                         (any shape with that many elements, e.g. [E/EP, EF])
//   shared_gate, shared_up [S*Fs, H], shared_down [H, S*Fs]   (MoE with S > 0)
//   shared_expert_gate [1, H]             (MoE with shared_gate)
//   dense_gate, dense_up [Fd, H], dense_down [H, Fd]           (dense)
// Two buffers, f32 whatever the precision, in the parameter views only (leave them empty
// in the gradient views: nothing differentiates them):
//   correction    [E]  e_score_correction_bias (score_correction), read
//   loads         [E]  optional (empty: skipped): every forward call that is not the
//                      backward's recompute ADDS this layer's token-copies per expert (the
//                      load the auxiliary-loss-free update reads; MoE only)
struct MoeLayerTensors {
  Tensor w_post, w_gate, experts, shared_gate, shared_up, shared_down, shared_expert_gate, dense_gate, dense_up,
      dense_down, w_gate_bias;
  Tensor correction, loads;
};

// The model's aux-loss statistics (layers/moe_router.h, ops::moe_aux_loss), device [E]
// each, owned by the model; any pointer may be null.
//   counts, prob_sums  forward ADDS this layer's router statistics (once per forward call:
//                      a checkpointed stack calls forward once per layer per step; the
//                      backward's recompute adds nothing)
//   aux_grad           backward reads it (d aux / d probs per expert; null: no aux loss)
//   count_loads        false: no forward adds into MoeLayerTensors::loads (an evaluation)
// DeepSeek-V3's sequence-wise balance loss (sigmoid scoring; null seq_counts: off), per MoE
// layer m (MoeLayerConfig::moe_index) at m * seq_stride, [sequences, E] each:
//   seq_counts, seq_psum  forward (not the recompute) ADDS ops::moe_router_seq_stats over
//                      local sequences of seq_tokens rows
//   seq_grad           true: seq_counts now hold the weights seq_w the backward adds
struct MoeAuxState {
  float* counts = nullptr;
  float* prob_sums = nullptr;
  const float* aux_grad = nullptr;
  bool count_loads = true;
  float* seq_counts = nullptr;
  float* seq_psum = nullptr;
  std::int64_t seq_stride = 0;
  std::int64_t seq_tokens = 0;
  bool seq_grad = false;
};

// One call's internals on T tokens (Component::layer); "(act)": elements of elem_bytes.
//   h [T, H] (act), rstd [T] f32                           both variants, both phases
//   router: probs [T, E] f32, ids [T, K] i32, weights [T, K] f32 (both phases),
//           d_weights [T, K] f32, d_logits16 [T, E] bf16   MoE only
//           (backward; d_logits16 bf16 only, else 0 bytes)
//   ffn: gate, up [R, side_ffn] (act) both phases;         shared experts (MoE, S > 0) or dense MLP,
//        act [R, side_ffn] (act) backward only              R = side_ffn_tile_rows(T, side_tile)
//        (forward writes act over gate; ffn.tile is 0 bytes: the layer's tile serves it)
//   shared_out [T, H] (act), gate_logit [T] f32            shared_gate only; f32 backward
//                                                          writes d gate_logit into gate_logit
//   gate_dz [T] bf16                                       shared_gate under bf16 only (dz
//                                                          apart from the fp32 z), backward
//   tile [min(T, 256), max(H, side_ffn)] f32               bf16 only (linear_tile_spec): forward
//                                                          with a side FFN, backward always
//   dh [T, H] (act)                                        backward
//   x_rows [T, H] (act)                                    backward_rows: the tile's input
//   x_in [T, H] (act)                                      forward, MoE only (0 bytes dense):
//                                                          the tile's input set aside when
//                                                          y is x (in place), for the
//                                                          residual after the dispatch
//                                                          wrote the routed output over it
// T here is the tile's rows, moe_tile_rows(tokens, seq_tile): with seq_tile every buffer
// above holds one tile.
// The bf16-only specs follow c.precision and are 0 bytes under f32, so the f32 specs are
// those of before the bf16 path.
struct MoeLayerBuffers {
  BufferSpec h, rstd;
  MoeRouterBuffers router;
  SwigluFfnBuffers ffn;
  BufferSpec shared_out, gate_logit;
  BufferSpec dh;
  BufferSpec x_in, x_rows;
  BufferSpec gate_dz{}, tile{};
};
// Activations in activation_dtype(c.precision).
MoeLayerBuffers moe_layer_buffers(std::int64_t tokens, const MoeLayerConfig& c);
// Activations in elements of elem_bytes (the planner's estimate; the bf16-only specs still
// follow c.precision).
MoeLayerBuffers moe_layer_buffers(std::int64_t tokens, const MoeLayerConfig& c, std::uint64_t elem_bytes);

// Phases "forward", "backward" and "backward rows" (backward_rows), Component::layer only (parameters and gradients are
// the parameter store's, the dispatch's buffers dispatch_footprint's). Without
// elem_bytes: the activations of c.precision (what the layer allocates).
Footprint moe_layer_footprint(std::int64_t tokens, const MoeLayerConfig& c);
Footprint moe_layer_footprint(std::int64_t tokens, const MoeLayerConfig& c, std::uint64_t elem_bytes);

class MoeLayer final : public Block {
 public:
  // params and grads: views as MoeLayerTensors says (checked; InvalidArgument on a wrong
  // shape or dtype). ep_group: the expert-parallel group (unused when dense); its size
  // divides E. aux: may be null (no statistics, no aux loss); otherwise it must outlive
  // the layer, and its pointers are read at every call, so the model may change them
  // between calls. Nothing is owned but the dispatch.
  MoeLayer(Device& dev, Communicator& ep_group, const MoeLayerConfig& config, const MoeLayerTensors& params,
           const MoeLayerTensors& grads, const MoeAuxState* aux);

  // x, y [T, H] of activation_dtype(precision) (T >= 0, may differ per rank); y may be x
  // itself (in place: y = x + mlp(x) over x, tile by tile, the same bits). MoE: collective
  // over ep_group (every rank calls it, T = 0 included).
  void forward(const Tensor& x, const Tensor& y) override;
  bool forward_in_place() const override { return true; }
  // forward without recording the router's statistics for the step (the aux loss's counts
  // and probability sums, the sequence-wise statistics, the load counts): the same y, bit
  // for bit (a checkpoint group's backward running the layer again).
  void forward_recompute(const Tensor& x, const Tensor& y) override;
  // Writes dx [T, H] (not aliasing x; dx may be dy itself: in place), adds into every parameter gradient
  // (replicated ones hold this rank's tokens' share: the model reduces them over data
  // parallelism). MoE: collective over ep_group, like forward.
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  bool backward_in_place() const override { return true; }
  // backward with x a row tile at a time (into x_rows, footprint phase "backward rows"):
  // the same dx and gradients, bit for bit. x.tokens may differ per rank, as T does.
  bool backward_by_rows() const override { return true; }
  void backward_rows(const RowSource& x, const Tensor& dy, const Tensor& dx) override;
  // HF names (Qwen convention) relative to the decoder layer: post_attention_layernorm.weight;
  // dense: mlp.gate_proj/up_proj/down_proj.weight; MoE: mlp.gate.weight, then for each
  // local expert mlp.experts.<global e>.gate_proj/up_proj/down_proj.weight (views into
  // `experts`), then mlp.shared_expert.* (S = 1 with gate, Qwen2-MoE) or
  // mlp.shared_experts.* (DeepSeek's one concatenated MLP), mlp.shared_expert_gate.weight.
  std::vector<Parameter> parameters() const override;
  void zero_grad() override;

  const MoeLayerConfig& config() const { return cfg_; }
  // Keep-through for the routed experts (ModelSchedules::keep_experts): a forward (not a
  // forward_recompute) keeps every tile's experts' gate, up, act and out on the device
  // (MoeDispatch's `kept`, dispatch_kept_buffer of the rows this rank computes, under
  // Component::dispatch) until this layer's backward, which then runs no expert forward
  // and frees them as it returns: the same bits, 3 of an expert row's 12 GEMMs a step
  // fewer. Off (the default) drops anything kept; a dense layer keeps nothing.
  void set_keep_experts(bool on);
  // The last call's dispatch statistics (MoE only): over row tiles (seq_tile), the tile
  // whose dispatch held the most device memory (dispatch_footprint of its sizes), so a
  // footprint from them is the call's peak; sizes.computed is the sum over the call's
  // tiles of dispatch_kept_rows (the rows the call's kept experts hold, each tile's store
  // whole Arena granules).
  const DispatchStats* dispatch_stats() const { return dispatch_ ? &stats_ : nullptr; }

 private:
  // The bodies, written once over the activation type A (float | bf16), in the .cc.
  struct Internals;
  // The internals one tile of at most `rows` tokens holds (allocated once a call), and
  // one tile's norm, router and side SwiGLU on its `rows` tokens from global row `first`.
  void allocate_internals(Internals& in, std::int64_t rows, bool for_backward);
  template <class A>
  void recompute(Internals& in, const A* x, std::int64_t rows, std::int64_t first, bool for_backward);
  // The number of row tiles of this call on T tokens (collective over the EP group for
  // an MoE layer with seq_tile), and a tile's first row and rows.
  std::int64_t tile_count(std::int64_t T);
  std::int64_t tile_first(std::int64_t i) const { return i * cfg_.seq_tile; }
  std::int64_t tile_rows(std::int64_t T, std::int64_t i) const;
  // Keeps the dispatch's statistics of tile `tile` of `tiles` just run when they held the
  // most memory (a call of one tile keeps them as they are).
  void note_dispatch(std::int64_t tile, std::int64_t tiles);
  // The side SwiGLU's weights (dense MLP or shared experts), and y += SwiGLU(h) over row
  // tiles (gate/up of `in` are the tile's scratch).
  template <class A>
  SwigluFfnWeightsOf<A> side_weights() const;
  template <class A>
  void side_forward(Internals& in, const A* h, std::int64_t T, A* y);
  template <class A>
  void forward_as(const Tensor& x, const Tensor& y);
  // x whole, or (x null) from rows a tile at a time.
  template <class A>
  void backward_as(const Tensor* x, const RowSource* rows, const Tensor& dy, const Tensor& dx);
  template <class A>
  void backward_tile(Internals& in, const A* x, const A* dy, A* dx, std::int64_t rows, std::int64_t first,
                     float* d_weights, A* dh, bf16* d_logits16, std::int64_t tile_index, std::int64_t tiles,
                     Buffer* kept);
  template <class A>
  void gated_backward(Internals& in, std::int64_t T, const A* dy, A* dh, bool dh_written);
  std::int64_t check_shape(const Tensor& t, const char* what) const;

  Device& dev_;
  MoeLayerConfig cfg_;
  MoeLayerTensors p_, g_;
  const MoeAuxState* aux_;
  bool records_ = true;  // a forward records the router's statistics (false: forward_recompute)
  int ep_rank_ = 0, ep_size_ = 1;
  Communicator* ep_group_ = nullptr;
  std::unique_ptr<MoeDispatch> dispatch_;
  DispatchStats stats_;
  std::uint64_t stats_bytes_ = 0;
  std::int64_t computed_ = 0;  // rows computed over the call's tiles so far
  bool keep_experts_ = false;
  std::vector<Buffer> kept_experts_;  // one per tile of the last keeping forward
};

}  // namespace peakbound
