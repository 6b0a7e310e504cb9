#include "peakbound/layers/moe_layer.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

#include "peakbound/core/dtype.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/core/error.h"
#include "peakbound/layers/layer_tensor_checks.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/moe_router.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/row_gate.h"
#include "peakbound/schedules/moe_footprint.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
// Activations are f32 or bf16 (MoeLayerConfig::precision); the elem_bytes footprint forms
// take their size. Statistics (rstd, router probs and weights, the gate logit) are f32 always.
const u64 kF32 = dtype_size(DType::f32);
const Component kC = Component::layer;

u64 U(std::int64_t v) { return static_cast<u64>(v); }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "moe layer buffer size"); }

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

MoeRouterShape router_shape(std::int64_t T, const MoeLayerConfig& c) {
  return MoeRouterShape{.tokens = T, .hidden = c.hidden, .experts = c.experts, .top_k = c.top_k,
                        .norm_topk_prob = c.norm_topk_prob, .scoring = c.scoring, .n_group = c.n_group,
                        .topk_group = c.topk_group, .routed_scaling = c.routed_scaling};
}

bool has_shared(const MoeLayerConfig& c) { return !c.dense() && c.shared_experts > 0; }
bool has_gate(const MoeLayerConfig& c) { return has_shared(c) && c.shared_gate; }

// The SwiGLU FFN in either precision: the f32 forms take no tile.
void ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                 const SwigluFfnWeights& w, float* gate, float* up, float* act, float* out, bool acc, float*) {
  swiglu_ffn_forward(dev, s, m, H, F, x, w, gate, up, act, out, acc);
}
void ffn_forward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const bf16* x,
                 const SwigluFfnWeightsBf16& w, bf16* gate, bf16* up, bf16* act, bf16* out, bool acc, float* tile) {
  swiglu_ffn_forward(dev, s, m, H, F, x, w, gate, up, act, out, acc, tile);
}
void ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const float* x,
                  const SwigluFfnWeights& w, const float* dout, float* gate, float* up, float* act,
                  const SwigluFfnGrads& dw, float* dx, bool acc, float*) {
  swiglu_ffn_backward(dev, s, m, H, F, x, w, dout, gate, up, act, dw, dx, acc);
}
void ffn_backward(Device& dev, Stream& s, std::int64_t m, std::int64_t H, std::int64_t F, const bf16* x,
                  const SwigluFfnWeightsBf16& w, const bf16* dout, bf16* gate, bf16* up, bf16* act,
                  const SwigluFfnGrads& dw, bf16* dx, bool acc, float* tile) {
  swiglu_ffn_backward(dev, s, m, H, F, x, w, dout, gate, up, act, dw, dx, acc, tile);
}

}  // namespace

// tile and gate_dz: bf16 only (null under f32).
struct MoeLayer::Internals {
  Buffer h, rstd, probs, ids, weights, gate, up, act, shared_out, gate_logit, tile, gate_dz;
};

void check_moe_layer_config(const MoeLayerConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument("moe layer: " + what); };
  if (c.hidden <= 0) bad("hidden must be positive (got " + std::to_string(c.hidden) + ")");
  if (c.dense_ffn < 0) bad("dense_ffn must be >= 0 (got " + std::to_string(c.dense_ffn) + ")");
  if (c.seq_tile < 0) bad("seq_tile must be >= 0 (got " + std::to_string(c.seq_tile) + ")");
  if (!(c.rms_eps >= 0.0f)) bad("rms_eps must be >= 0 (got " + std::to_string(c.rms_eps) + ")");
  if (c.dense()) return;
  if (c.scoring == RouterScoring::softmax && (c.score_correction || c.n_group != 1 || c.topk_group != 1 ||
                                              c.routed_scaling != 1.0f))
    bad("score_correction, n_group, topk_group and routed_scaling need sigmoid scoring");
  if (c.scoring == RouterScoring::sigmoid && c.router_bias)
    bad("router_bias with sigmoid scoring is not supported (gpt-oss's biased router is softmax)");
  if (!(c.routed_scaling > 0.0f))
    bad("routed_scaling must be positive (got " + std::to_string(c.routed_scaling) + ")");
  if (c.ffn <= 0) bad("ffn must be positive (got " + std::to_string(c.ffn) + ")");
  if (c.experts <= 0) bad("experts must be positive (got " + std::to_string(c.experts) + ")");
  if (c.top_k < 1 || c.top_k > c.experts)
    bad("top_k must be in [1, experts = " + std::to_string(c.experts) + "] (got " + std::to_string(c.top_k) + ")");
  if (c.shared_experts < 0) bad("shared_experts must be >= 0 (got " + std::to_string(c.shared_experts) + ")");
  if (c.shared_experts > 0 && c.shared_ffn <= 0)
    bad("shared_ffn must be positive with shared experts (got " + std::to_string(c.shared_ffn) + ")");
  if (c.shared_gate && c.shared_experts == 0) bad("shared_gate needs shared_experts > 0");
  check_dispatch_options(c.dispatch);
  check_moe_router_shape(router_shape(0, c));  // sigmoid groups against E and K
}

MoeLayerConfig moe_layer_config(const ModelConfig& m, std::int64_t layer, float rms_eps, DispatchKind kind,
                                const DispatchOptions& options) {
  auto bad = [](const std::string& what) { throw InvalidArgument("moe layer: " + what); };
  if (layer < 0 || layer >= m.num_layers)
    bad("layer " + std::to_string(layer) + " is outside [0, num_layers = " + std::to_string(m.num_layers) + ")");
  MoeLayerConfig c;
  c.hidden = m.hidden_size;
  c.rms_eps = rms_eps;
  if (!m.is_moe_layer(layer)) {
    if (m.mlp_bias) bad("mlp_bias on a dense MLP is not supported (only gpt-oss's routed experts take biases)");
    if (m.dense_intermediate_size <= 0)
      bad("layer " + std::to_string(layer) + " is dense but dense_intermediate_size is " +
          std::to_string(m.dense_intermediate_size));
    c.dense_ffn = m.dense_intermediate_size;
    check_moe_layer_config(c);
    return c;
  }
  if (m.mlp_bias && m.num_shared_experts > 0) bad("mlp_bias on shared experts is not supported");
  c.router_bias = m.router_bias;
  c.expert_bias = m.mlp_bias;
  c.clamped = m.swiglu_limit > 0.0;
  c.clamp = ops::SwigluClamp{static_cast<float>(m.swiglu_alpha), static_cast<float>(m.swiglu_limit)};
  c.ffn = m.moe_intermediate_size;
  c.experts = m.num_experts;
  c.top_k = m.top_k;
  c.norm_topk_prob = m.norm_topk_prob;
  c.scoring = m.router_scoring;
  c.score_correction = m.router_score_correction;
  c.n_group = m.n_group;
  c.topk_group = m.topk_group;
  c.routed_scaling = static_cast<float>(m.routed_scaling_factor);
  c.shared_experts = m.num_shared_experts;
  c.shared_ffn = m.num_shared_experts > 0 ? m.shared_expert_width() : 0;
  c.shared_gate = m.shared_expert_gate;
  c.kind = kind;
  c.dispatch = options;
  check_moe_layer_config(c);
  return c;
}

MoeShape moe_layer_dispatch_shape(const MoeLayerConfig& c) {
  check_moe_layer_config(c);
  if (c.dense()) throw InvalidArgument("moe layer: a dense layer has no routed experts");
  MoeShape s{c.hidden, c.ffn, c.experts, c.top_k};
  s.bias = c.expert_bias;
  s.clamped = c.clamped;
  s.clamp = c.clamp;
  return s;
}

MoeLayerBuffers moe_layer_buffers(std::int64_t T, const MoeLayerConfig& c, u64 a) {
  check_moe_layer_config(c);
  if (T < 0) throw InvalidArgument("moe layer: tokens must be >= 0 (got " + std::to_string(T) + ")");
  T = moe_tile_rows(T, c.seq_tile);  // one row tile's buffers (all rows without seq_tile)
  const u64 t = U(T), H = U(c.hidden);
  MoeLayerBuffers b;
  b.h = buffer_spec(kC, mul(t, H), a);
  b.rstd = buffer_spec(kC, t, kF32);
  if (!c.dense()) b.router = moe_router_buffers(router_shape(T, c), c.precision, kC);
  else b.router = {buffer_spec(kC, 0, kF32), buffer_spec(kC, 0, kF32), buffer_spec(kC, 0, kF32),
                   buffer_spec(kC, 0, kF32), buffer_spec(kC, 0, kF32)};
  const std::int64_t side = c.side_ffn();
  if (side > 0) b.ffn = swiglu_ffn_buffers(side_ffn_tile_rows(T, c.side_tile), side, a, kC);
  else b.ffn = swiglu_ffn_buffers(0, 1, a, kC);  // no side FFN: empty specs
  const u64 g = has_gate(c) ? 1 : 0;
  b.shared_out = buffer_spec(kC, mul(g, mul(t, H)), a);
  b.gate_logit = buffer_spec(kC, mul(g, t), kF32);
  b.dh = buffer_spec(kC, mul(t, H), a);
  b.x_in = buffer_spec(kC, c.dense() ? 0 : mul(t, H), a);
  b.x_rows = buffer_spec(kC, mul(t, H), a);
  // bf16 only: dz apart from the fp32 z, and the fp32 tile of every linear (router and
  // gate dh contributions [T, H], the side SwiGLU's [R, max(H, side)]).
  const bool bf = c.precision == Precision::bf16;
  b.gate_dz = buffer_spec(kC, mul(bf ? g : 0, t), dtype_size(DType::bf16));
  b.tile = linear_tile_spec(T, std::max(c.hidden, side), c.precision, kC);
  return b;
}

MoeLayerBuffers moe_layer_buffers(std::int64_t T, const MoeLayerConfig& c) {
  return moe_layer_buffers(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint moe_layer_footprint(std::int64_t T, const MoeLayerConfig& c) {
  return moe_layer_footprint(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint moe_layer_footprint(std::int64_t T, const MoeLayerConfig& c, u64 elem_bytes) {
  const MoeLayerBuffers b = moe_layer_buffers(T, c, elem_bytes);
  Footprint f("moe layer");
  for (const std::string_view phase : {"forward", "backward", "backward rows"}) {
    const bool bwd = phase != "forward";
    if (phase == "backward rows") f.device(phase, b.x_rows);
    for (const BufferSpec& s : {b.h, b.rstd, b.router.probs, b.router.ids, b.router.weights, b.ffn.gate, b.ffn.up,
                                b.shared_out, b.gate_logit})
      f.device(phase, s);
    if (bwd || c.side_ffn() > 0) f.device(phase, b.tile);  // 0 bytes under f32
    if (!bwd) f.device(phase, b.x_in);                       // 0 bytes dense
    if (bwd) {
      f.device(phase, b.ffn.act);
      f.device(phase, b.router.d_weights);
      f.device(phase, b.dh);
      f.device(phase, b.router.d_logits16);  // 0 bytes under f32
      f.device(phase, b.gate_dz);            // 0 bytes under f32
    }
  }
  return f;
}

MoeLayer::MoeLayer(Device& dev, Communicator& ep_group, const MoeLayerConfig& config, const MoeLayerTensors& params,
                   const MoeLayerTensors& grads, const MoeAuxState* aux)
    : dev_(dev), cfg_(config), p_(params), g_(grads), aux_(aux) {
  check_moe_layer_config(cfg_);
  const std::int64_t H = cfg_.hidden;
  // Parameters in param_dtype(precision), gradients f32.
  DType want = DType::f32;
  auto expect = [&want](const Tensor& t, const Shape& s, const char* name, const char* which) {
    expect_layer_tensor(t, s, want, "moe layer", which, name);
  };
  if (!cfg_.dense()) {
    ep_rank_ = ep_group.rank();
    ep_size_ = ep_group.size();
    ep_group_ = &ep_group;
    if (cfg_.experts % ep_size_ != 0)
      throw InvalidArgument("moe layer: experts (" + std::to_string(cfg_.experts) +
                            ") must be divisible by the expert-parallel group size (" + std::to_string(ep_size_) +
                            ")");
  }
  const std::int64_t local = cfg_.dense() ? 0 : cfg_.experts / ep_size_;
  const std::int64_t expert_elems = cfg_.dense() ? 0 : local * moe_layer_dispatch_shape(cfg_).expert_floats();
  const std::int64_t side = cfg_.side_ffn();
  for (auto [t, which] : {std::pair{&p_, "parameter"}, std::pair{&g_, "gradient"}}) {
    want = t == &p_ ? param_dtype(cfg_.precision) : DType::f32;
    expect(t->w_post, Shape{H}, "w_post", which);
    if (cfg_.dense()) {
      expect(t->dense_gate, Shape{side, H}, "dense_gate", which);
      expect(t->dense_up, Shape{side, H}, "dense_up", which);
      expect(t->dense_down, Shape{H, side}, "dense_down", which);
      continue;
    }
    expect(t->w_gate, Shape{cfg_.experts, H}, "w_gate", which);
    if (cfg_.router_bias) expect(t->w_gate_bias, Shape{cfg_.experts}, "w_gate_bias", which);
    if (t == &p_) {  // the f32 buffers (parameter views only)
      want = DType::f32;
      if (cfg_.score_correction) expect(t->correction, Shape{cfg_.experts}, "correction", which);
      if (t->loads.raw() != nullptr) expect(t->loads, Shape{cfg_.experts}, "loads", which);
      want = param_dtype(cfg_.precision);
    }
    if (t->experts.raw() == nullptr || t->experts.dtype() != want || t->experts.numel() != expert_elems)
      throw InvalidArgument(std::string("moe layer: ") + which + " experts is " + t->experts.shape().str() + " " +
                            std::string(dtype_name(t->experts.dtype())) + ", want " + std::to_string(local) +
                            " local experts x " + (cfg_.expert_bias ? "(3FH + 2F + H)" : "3FH") + " = " +
                            std::to_string(expert_elems) + " " +
                            std::string(dtype_name(want)) + " elements");
    if (side > 0) {
      expect(t->shared_gate, Shape{side, H}, "shared_gate", which);
      expect(t->shared_up, Shape{side, H}, "shared_up", which);
      expect(t->shared_down, Shape{H, side}, "shared_down", which);
    }
    if (cfg_.shared_gate) expect(t->shared_expert_gate, Shape{1, H}, "shared_expert_gate", which);
  }
  if (!cfg_.dense())
    dispatch_ = std::make_unique<MoeDispatch>(dev_, ep_group, moe_layer_dispatch_shape(cfg_), cfg_.kind, cfg_.dispatch,
                                              cfg_.precision);
}

std::int64_t MoeLayer::check_shape(const Tensor& t, const char* what) const {
  return layer_activation_rows(t, cfg_.hidden, activation_dtype(cfg_.precision), "moe layer", what);
}

void MoeLayer::allocate_internals(Internals& in, std::int64_t rows, bool for_backward) {
  const MoeLayerBuffers b = moe_layer_buffers(rows, cfg_);
  in.h = allocate(dev_, b.h);
  in.rstd = allocate(dev_, b.rstd);
  in.probs = allocate(dev_, b.router.probs);
  in.ids = allocate(dev_, b.router.ids);
  in.weights = allocate(dev_, b.router.weights);
  in.gate = allocate(dev_, b.ffn.gate);
  in.up = allocate(dev_, b.ffn.up);
  // Forward writes act over gate (swiglu's out may alias its gate): only backward, which
  // reuses the three as its scratch, holds act apart.
  if (for_backward) in.act = allocate(dev_, b.ffn.act);
  in.shared_out = allocate(dev_, b.shared_out);
  in.gate_logit = allocate(dev_, b.gate_logit);
  if (for_backward || cfg_.side_ffn() > 0) in.tile = allocate(dev_, b.tile);  // bf16 only (else null)
}

namespace {
// f(a, n, seq, seq_rows) over a tile's rows [0, rows) (global rows first + a...) for the
// per-sequence kernels (the sequence-wise statistics and weights, sequences of st rows):
// a tile of whole sequences in one call (rows [0, rows) from sequence first / st, st rows
// each: the kernels' own per-sequence loop); else each run [a, a + n) that lies in one
// sequence `seq`, as one sequence of n rows (a tile may start or end inside one).
template <class F>
void for_sequence_runs(std::int64_t first, std::int64_t rows, std::int64_t st, const F& f) {
  if (first % st == 0 && rows % st == 0) {
    f(std::int64_t{0}, rows, first / st, st);
    return;
  }
  for (std::int64_t a = 0; a < rows;) {
    const std::int64_t seq = (first + a) / st, b = std::min(rows, (seq + 1) * st - first);
    f(a, b - a, seq, b - a);
    a = b;
  }
}
}  // namespace

// One tile's norm, router (its statistics added only by a forward) and the side SwiGLU's
// gate/up/act (and, with the shared gate, the shared output and the gate logit) on its
// `rows` tokens x, global rows [first, first + rows) of the call, into `in`.
template <class A>
void MoeLayer::recompute(Internals& in, const A* x, std::int64_t T, std::int64_t first, bool for_backward) {
  if (T == 0) return;
  A* act = for_backward ? in.act.as<A>() : in.gate.as<A>();
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden;
  A* h = in.h.as<A>();
  ops::rmsnorm_forward(dev_, s, h, in.rstd.as<float>(), x, p_.w_post.data<A>(), T, H, cfg_.rms_eps);
  if (!cfg_.dense()) {
    float* counts = nullptr;
    float* prob_sums = nullptr;
    const bool record = !for_backward && records_;  // a recomputation records nothing
    if (record && aux_ != nullptr) {
      counts = aux_->counts;
      prob_sums = aux_->prob_sums;
    }
    moe_router_forward(dev_, s, router_shape(T, cfg_), h, p_.w_gate.data<A>(), in.probs.as<float>(),
                       in.ids.as<std::int32_t>(), in.weights.as<float>(), counts, prob_sums,
                       cfg_.router_bias ? p_.w_gate_bias.data<A>() : nullptr,
                       cfg_.score_correction ? p_.correction.data<float>() : nullptr);
    if (record && aux_ != nullptr && aux_->seq_counts != nullptr) {
      const std::int64_t at = cfg_.moe_index * aux_->seq_stride, st = aux_->seq_tokens, E = cfg_.experts,
                         K = cfg_.top_k;
      const float* probs = in.probs.as<float>();
      const std::int32_t* ids = in.ids.as<std::int32_t>();
      for_sequence_runs(first, T, st, [&](std::int64_t a, std::int64_t n, std::int64_t seq, std::int64_t seq_rows) {
        const std::int64_t b = at + seq * E;
        ops::moe_router_seq_stats(dev_, s, aux_->seq_counts + b, aux_->seq_psum + b, probs + a * E, ids + a * K, n, E,
                                  K, seq_rows);
      });
    }
    if (record && p_.loads.raw() != nullptr && (aux_ == nullptr || aux_->count_loads))
      ops::moe_router_stats(dev_, s, p_.loads.data<float>(), nullptr, in.probs.as<float>(),
                            in.ids.as<std::int32_t>(), T, cfg_.experts, cfg_.top_k);
  }
  if (has_gate(cfg_)) {
    // z = h W_sg^T [T, 1] (fp32); the shared experts' output kept apart for the gate, tile
    // by tile (a single tile's gate/up/act stay valid for the backward).
    ops::gemm(dev_, s, false, true, T, 1, H, 1.0f, h, H, p_.shared_expert_gate.data<A>(), H, 0.0f,
              in.gate_logit.as<float>(), 1);  // fp32 gate logits (bf16 operands accumulate in fp32)
    const std::int64_t R = side_ffn_tile_rows(T, cfg_.side_tile);
    for (std::int64_t r0 = 0; r0 < T; r0 += R)
      ffn_forward(dev_, s, std::min(R, T - r0), H, cfg_.side_ffn(), h + r0 * H, side_weights<A>(), in.gate.as<A>(),
                  in.up.as<A>(), act, in.shared_out.as<A>() + r0 * H, false, in.tile.as<float>());
  }
}

std::int64_t MoeLayer::tile_count(std::int64_t T) {
  if (cfg_.seq_tile <= 0) return 1;
  std::int64_t most = T;
  // The dispatch is collective: every rank of the group runs as many tiles as the rank
  // with the most tokens.
  if (!cfg_.dense() && ep_size_ > 1) ep_group_->all_reduce(&most, 1, DType::i64, ReduceOp::max);
  return moe_tile_count(most, cfg_.seq_tile);
}

std::int64_t MoeLayer::tile_rows(std::int64_t T, std::int64_t i) const {
  if (cfg_.seq_tile <= 0) return T;
  return std::clamp<std::int64_t>(T - tile_first(i), 0, cfg_.seq_tile);
}

void MoeLayer::note_dispatch(std::int64_t tile, std::int64_t tiles) {
  const DispatchStats& st = dispatch_->stats();
  // The call's kept stores, one a tile, each whole Arena granules (dispatch_kept_rows).
  computed_ = (tile == 0 ? 0 : computed_) +
              dispatch_kept_rows(moe_layer_dispatch_shape(cfg_), st.sizes.computed, cfg_.precision);
  if (tiles == 1) {  // the call's only dispatch: nothing to compare
    stats_ = st;
    stats_.sizes.computed = computed_;
    return;
  }
  const std::uint64_t bytes =
      dispatch_footprint(moe_layer_dispatch_shape(cfg_), st.sizes, cfg_.precision).device_peak_total();
  if (tile == 0 || bytes > stats_bytes_) {
    stats_ = st;
    stats_bytes_ = bytes;
  }
  stats_.sizes.computed = computed_;
}

void MoeLayer::set_keep_experts(bool on) {
  keep_experts_ = on && !cfg_.dense();
  if (!keep_experts_) kept_experts_.clear();  // nothing kept outlives the mode
}

template <class A>
SwigluFfnWeightsOf<A> MoeLayer::side_weights() const {
  const MoeLayerTensors& w = p_;
  return cfg_.dense() ? SwigluFfnWeightsOf<A>{w.dense_gate.data<A>(), w.dense_up.data<A>(), w.dense_down.data<A>()}
                      : SwigluFfnWeightsOf<A>{w.shared_gate.data<A>(), w.shared_up.data<A>(), w.shared_down.data<A>()};
}

template <class A>
void MoeLayer::side_forward(Internals& in, const A* h, std::int64_t T, A* y) {
  // y += SwiGLU(h), tile by tile; act written over gate (bf16: the down product added
  // into y through nn/linear, one rounding).
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, R = side_ffn_tile_rows(T, cfg_.side_tile);
  for (std::int64_t r0 = 0; r0 < T; r0 += R)
    ffn_forward(dev_, s, std::min(R, T - r0), H, cfg_.side_ffn(), h + r0 * H, side_weights<A>(), in.gate.as<A>(),
                in.up.as<A>(), in.gate.as<A>(), y + r0 * H, /*accumulate_out=*/true, in.tile.as<float>());
}

void MoeLayer::forward(const Tensor& x, const Tensor& y) {
  const PhaseScope phase(StepPhase::experts);
  if (cfg_.precision == Precision::bf16)
    forward_as<bf16>(x, y);
  else
    forward_as<float>(x, y);
}

void MoeLayer::forward_recompute(const Tensor& x, const Tensor& y) {
  records_ = false;
  try {
    forward(x, y);
  } catch (...) {
    records_ = true;
    throw;
  }
  records_ = true;
}

template <class A>
void MoeLayer::forward_as(const Tensor& x, const Tensor& y) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(y, "y") == T, "moe layer: y must be [T, H] like x");
  const bool in_place = T > 0 && y.raw() == x.raw();
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, tiles = tile_count(T), R = moe_tile_rows(T, cfg_.seq_tile);
  Internals in;
  allocate_internals(in, R, /*for_backward=*/false);
  // The routed output is written over the tile's rows of y before the residual adds x:
  // in place, x's rows are set aside first (allocated either way: the footprint's).
  const Buffer x_in = allocate(dev_, moe_layer_buffers(R, cfg_).x_in);
  const A* h = in.h.as<A>();
  // A step's forward (not a group's recomputation, which leaves what the forward kept)
  // keeps every tile's experts for the backward, or drops what an earlier one kept.
  const bool keeping = keep_experts_ && records_;
  if (records_) kept_experts_.clear();
  if (keeping) kept_experts_.resize(static_cast<std::size_t>(tiles));
  for (std::int64_t i = 0; i < tiles; ++i) {
    const std::int64_t r0 = tile_first(i), rows = tile_rows(T, i);
    const A* xp = rows > 0 ? x.data<A>() + r0 * H : nullptr;
    A* yp = rows > 0 ? y.data<A>() + r0 * H : nullptr;
    recompute<A>(in, xp, rows, r0, /*for_backward=*/false);
    if (cfg_.dense()) {
      if (rows == 0) continue;
      // y = x + SwiGLU(h) (in place: y is x already).
      if (!in_place)
        dev_.memcpy_async(yp, xp, static_cast<std::size_t>(rows * H) * sizeof(A), CopyKind::device_to_device, s);
      side_forward<A>(in, h, rows, yp);
      continue;
    }
    if (in_place && rows > 0) {
      dev_.memcpy_async(x_in.data(), xp, static_cast<std::size_t>(rows * H) * sizeof(A), CopyKind::device_to_device,
                        s);
      xp = x_in.as<A>();
    }
    // routed (written into y; a collective: every rank calls it, rows = 0 included), + x, + shared.
    dispatch_->forward(h, rows, in.ids.as<std::int32_t>(), in.weights.as<float>(), p_.experts.data<A>(), yp,
                       keeping ? &kept_experts_[static_cast<std::size_t>(i)] : nullptr);
    note_dispatch(i, tiles);
    if (rows == 0) continue;
    ops::axpy(dev_, s, yp, xp, rows * H, 1.0f);
    if (has_gate(cfg_)) {
      ops::row_gate_forward(dev_, s, yp, in.shared_out.as<A>(), in.gate_logit.as<float>(), rows, H, true);
    } else if (cfg_.side_ffn() > 0) {
      side_forward<A>(in, h, rows, yp);
    }
  }
  // The internals are freed on return: whatever reuses their memory next is ordered
  // after this work on the compute stream.
}

void MoeLayer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const PhaseScope phase(StepPhase::experts);
  if (cfg_.precision == Precision::bf16)
    backward_as<bf16>(&x, nullptr, dy, dx);
  else
    backward_as<float>(&x, nullptr, dy, dx);
}

void MoeLayer::backward_rows(const RowSource& x, const Tensor& dy, const Tensor& dx) {
  const PhaseScope phase(StepPhase::experts);
  if (x.tokens < 0 || x.hidden != cfg_.hidden || x.dtype != activation_dtype(cfg_.precision) || !x.fill)
    throw InvalidArgument("moe layer: backward_rows' input must be [T, " + std::to_string(cfg_.hidden) + "] " +
                          std::string(dtype_name(activation_dtype(cfg_.precision))) + " rows with a fill");
  if (cfg_.precision == Precision::bf16)
    backward_as<bf16>(nullptr, &x, dy, dx);
  else
    backward_as<float>(nullptr, &x, dy, dx);
}

// The Qwen2-MoE gate's backward: d shared = sigmoid(z) dy into shared_out's buffer, dz
// (f32: into gate_logit's buffer over z; bf16: into gate_dz, apart from the fp32 z); then
// dW_sg += dz^T h [1, H] (fp32) and dh (+)= dz W_sg (bf16: one rounding).
template <class A>
void MoeLayer::gated_backward(Internals& in, std::int64_t T, const A* dy, A* dh, bool dh_written) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden;
  float* z = in.gate_logit.as<float>();
  A* dshared = in.shared_out.as<A>();
  A* dz = nullptr;
  if constexpr (std::is_same_v<A, float>)
    dz = z;
  else
    dz = in.gate_dz.as<bf16>();
  ops::row_gate_backward(dev_, s, dshared, dz, dy, dshared, z, T, H);
  ops::gemm(dev_, s, true, false, 1, H, T, 1.0f, dz, 1, in.h.as<A>(), H, 1.0f, g_.shared_expert_gate.data<float>(),
            H);
  linear(dev_, s, T, H, {{.a = dz, .lda = 1, .b = p_.shared_expert_gate.data<A>(), .ldb = H, .k = 1, .trans_b = false}},
         dh, H, dh_written ? LinearMode::add : LinearMode::write, in.tile.as<float>());
}

template <class A>
void MoeLayer::backward_as(const Tensor* x, const RowSource* src, const Tensor& dy, const Tensor& dx) {
  const std::int64_t T = x != nullptr ? check_shape(*x, "x") : src->tokens;
  PB_CHECK_MSG(check_shape(dy, "dy") == T && check_shape(dx, "dx") == T, "moe layer: token counts differ");
  PB_CHECK_MSG(T == 0 || x == nullptr || dx.raw() != x->raw(), "moe layer: dx must not alias x");
  const std::int64_t tiles = tile_count(T), R = moe_tile_rows(T, cfg_.seq_tile);
  const MoeLayerBuffers b = moe_layer_buffers(R, cfg_);
  // From rows: each tile's input into x_rows first (nothing allocated when x is whole).
  const Buffer x_rows = src != nullptr ? allocate(dev_, b.x_rows) : Buffer{};
  Internals in;
  allocate_internals(in, R, /*for_backward=*/true);
  Buffer d_weights = allocate(dev_, b.router.d_weights), dh_buf = allocate(dev_, b.dh);
  Buffer d_logits16 = allocate(dev_, b.router.d_logits16);  // bf16 only (else null)
  in.gate_dz = allocate(dev_, b.gate_dz);                    // bf16 only (else null)
  const std::int64_t H = cfg_.hidden;
  // What this layer's last forward kept (one store per tile), spent tile by tile and
  // freed as the backward returns (so the footprint's backward holds all of them).
  const bool kept = keep_experts_ && static_cast<std::int64_t>(kept_experts_.size()) == tiles;
  for (std::int64_t i = 0; i < tiles; ++i) {
    const std::int64_t r0 = tile_first(i), rows = tile_rows(T, i);
    const A* xp = nullptr;
    if (rows > 0 && src != nullptr) {
      src->fill(r0, rows, x_rows.data());
      xp = x_rows.as<A>();
    } else if (rows > 0) {
      xp = x->data<A>() + r0 * H;
    }
    const A* dyp = rows > 0 ? dy.data<A>() + r0 * H : nullptr;
    A* dxp = rows > 0 ? dx.data<A>() + r0 * H : nullptr;
    recompute<A>(in, xp, rows, r0, /*for_backward=*/true);
    backward_tile<A>(in, xp, dyp, dxp, rows, r0, d_weights.as<float>(), dh_buf.as<A>(), d_logits16.as<bf16>(), i,
                     tiles, kept ? &kept_experts_[static_cast<std::size_t>(i)] : nullptr);
  }
  kept_experts_.clear();
}

// One tile's backward (rows tokens from global row first): the routed experts (collective,
// rows = 0 included), the router, the side SwiGLU, then dx = dy + the norm's backward.
template <class A>
void MoeLayer::backward_tile(Internals& in, const A* xp, const A* dyp, A* dxp, std::int64_t T, std::int64_t first,
                             float* d_weights, A* dh, bf16* d_logits16, std::int64_t tile_index,
                             std::int64_t tiles, Buffer* kept) {
  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, Fs = cfg_.side_ffn(), E = cfg_.experts, K = cfg_.top_k;
  A* h = in.h.as<A>();
  float* tile = in.tile.as<float>();
  bool dh_written = false;
  if (!cfg_.dense()) {
    // Routed experts (collective, T = 0 included): dh written, d_weights written,
    // this rank's expert gradients added.
    dispatch_->backward(h, T, in.ids.as<std::int32_t>(), in.weights.as<float>(), p_.experts.data<A>(), dyp, dh,
                        d_weights, g_.experts.data<float>(), kept);
    note_dispatch(tile_index, tiles);
    if (T == 0) return;
    // Router: dlogits (with the aux term) into probs, dW_gate added, dh added.
    const float* aux_grad = aux_ != nullptr ? aux_->aux_grad : nullptr;
    const bool seq = aux_ != nullptr && aux_->seq_counts != nullptr && aux_->seq_grad;
    const float* seq_w = seq ? aux_->seq_counts + cfg_.moe_index * aux_->seq_stride : nullptr;
    const std::int64_t st = seq ? aux_->seq_tokens : 0;
    float* probs = in.probs.as<float>();
    const std::int32_t* ids = in.ids.as<std::int32_t>();
    float* dbias = cfg_.router_bias ? g_.w_gate_bias.data<float>() : nullptr;
    // Rows [a, a + n) of the tile with the weights of their sequences from seq_w_at.
    auto router = [&](std::int64_t a, std::int64_t n, const float* seq_w_at, std::int64_t seq_tokens) {
      const MoeRouterShape rs = router_shape(n, cfg_);
      if constexpr (std::is_same_v<A, float>)
        moe_router_backward(dev_, s, rs, h + a * H, p_.w_gate.data<float>(), d_weights + a * K, probs + a * E,
                            ids + a * K, aux_grad, g_.w_gate.data<float>(), dh + a * H, /*accumulate_dx=*/true, dbias,
                            seq_w_at, seq_tokens);
      else
        moe_router_backward(dev_, s, rs, h + a * H, p_.w_gate.data<bf16>(), d_weights + a * K, probs + a * E,
                            ids + a * K, aux_grad, g_.w_gate.data<float>(), dh + a * H, /*accumulate_dx=*/true,
                            d_logits16 + a * E, tile, dbias, seq_w_at, seq_tokens);
    };
    if (!seq) {
      router(0, T, nullptr, 0);
    } else {
      for_sequence_runs(first, T, st, [&](std::int64_t a, std::int64_t n, std::int64_t q, std::int64_t seq_rows) {
        router(a, n, seq_w + q * E, seq_rows);
      });
    }
    dh_written = true;
  }
  if (T == 0) return;
  if (Fs > 0) {
    const MoeLayerTensors& g = g_;
    const SwigluFfnWeightsOf<A> sw = side_weights<A>();
    const SwigluFfnGrads sg =
        cfg_.dense() ? SwigluFfnGrads{g.dense_gate.data<float>(), g.dense_up.data<float>(), g.dense_down.data<float>()}
                     : SwigluFfnGrads{g.shared_gate.data<float>(), g.shared_up.data<float>(),
                                      g.shared_down.data<float>()};
    const A* dout = dyp;
    if (has_gate(cfg_)) {
      gated_backward<A>(in, T, dyp, dh, dh_written);
      dh_written = true;
      dout = in.shared_out.as<A>();  // d shared
    }
    // Tile by tile: gate/up/act of the tile (recomputed unless the gated path's single
    // tile still holds them), then its backward: dh rows written or added, dW added.
    const std::int64_t R = side_ffn_tile_rows(T, cfg_.side_tile);
    const bool held = has_gate(cfg_) && R == T;
    for (std::int64_t r0 = 0; r0 < T; r0 += R) {
      const std::int64_t rows = std::min(R, T - r0);
      if (!held)
        ffn_forward(dev_, s, rows, H, Fs, h + r0 * H, sw, in.gate.as<A>(), in.up.as<A>(), in.act.as<A>(), nullptr,
                    false, tile);
      ffn_backward(dev_, s, rows, H, Fs, h + r0 * H, sw, dout + r0 * H, in.gate.as<A>(), in.up.as<A>(),
                   in.act.as<A>(), sg, dh + r0 * H, dh_written, tile);
    }
    dh_written = true;
  }
  PB_CHECK_MSG(dh_written, "moe layer: no path wrote dh");
  // dx = dy (the residual path) + post_attention_layernorm's backward, which adds. In
  // place (dx is dy) the residual is already there: the tile's dy rows were last read
  // above (the dispatch, the gate, the side SwiGLU), and no other tile reads them.
  if (dxp != dyp)
    dev_.memcpy_async(dxp, dyp, static_cast<std::size_t>(T * H) * sizeof(A), CopyKind::device_to_device, s);
  ops::rmsnorm_backward(dev_, s, dxp, g_.w_post.data<float>(), dh, xp, p_.w_post.data<A>(), in.rstd.as<float>(), T,
                        H);
}

std::vector<Parameter> MoeLayer::parameters() const {
  std::vector<Parameter> out = {{"post_attention_layernorm.weight", p_.w_post, g_.w_post}};
  if (cfg_.dense()) {
    out.push_back({"mlp.gate_proj.weight", p_.dense_gate, g_.dense_gate});
    out.push_back({"mlp.up_proj.weight", p_.dense_up, g_.dense_up});
    out.push_back({"mlp.down_proj.weight", p_.dense_down, g_.dense_down});
    return out;
  }
  out.push_back({"mlp.gate.weight", p_.w_gate, g_.w_gate});
  if (cfg_.router_bias) out.push_back({"mlp.gate.bias", p_.w_gate_bias, g_.w_gate_bias});
  const std::int64_t H = cfg_.hidden, F = cfg_.ffn, local = cfg_.experts / ep_size_;
  const std::int64_t EF = moe_layer_dispatch_shape(cfg_).expert_floats();
  for (std::int64_t i = 0; i < local; ++i) {
    const std::string name = "mlp.experts." + std::to_string(ep_rank_ * local + i) + ".";
    // Element offsets into the flat buffer, in bytes of its dtype (bf16 parameters, f32
    // gradients).
    auto view = [&](const Tensor& t, std::int64_t offset, Shape shape) {
      const auto at = static_cast<std::uint64_t>(i * EF + offset) * dtype_size(t.dtype());
      return Tensor(static_cast<std::byte*>(t.raw()) + at, shape, t.dtype(), t.location());
    };
    out.push_back({name + "gate_proj.weight", view(p_.experts, 0, Shape{F, H}), view(g_.experts, 0, Shape{F, H})});
    out.push_back(
        {name + "up_proj.weight", view(p_.experts, F * H, Shape{F, H}), view(g_.experts, F * H, Shape{F, H})});
    out.push_back({name + "down_proj.weight", view(p_.experts, 2 * F * H, Shape{H, F}),
                   view(g_.experts, 2 * F * H, Shape{H, F})});
    if (cfg_.expert_bias) {
      const std::int64_t b = 3 * F * H;
      out.push_back({name + "gate_proj.bias", view(p_.experts, b, Shape{F}), view(g_.experts, b, Shape{F})});
      out.push_back({name + "up_proj.bias", view(p_.experts, b + F, Shape{F}), view(g_.experts, b + F, Shape{F})});
      out.push_back(
          {name + "down_proj.bias", view(p_.experts, b + 2 * F, Shape{H}), view(g_.experts, b + 2 * F, Shape{H})});
    }
  }
  if (cfg_.shared_experts > 0) {
    const std::string pre = cfg_.shared_experts == 1 && cfg_.shared_gate ? "mlp.shared_expert." : "mlp.shared_experts.";
    out.push_back({pre + "gate_proj.weight", p_.shared_gate, g_.shared_gate});
    out.push_back({pre + "up_proj.weight", p_.shared_up, g_.shared_up});
    out.push_back({pre + "down_proj.weight", p_.shared_down, g_.shared_down});
  }
  if (cfg_.shared_gate) out.push_back({"mlp.shared_expert_gate.weight", p_.shared_expert_gate, g_.shared_expert_gate});
  return out;
}

void MoeLayer::zero_grad() {
  Stream& s = dev_.compute_stream();
  for (const Parameter& p : parameters()) ops::fill(dev_, s, p.grad.data<float>(), p.grad.numel(), 0.0f);
}

}  // namespace peakbound
