#include "peakbound/layers/attention_layer.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/layers/layer_tensor_checks.h"
#include "peakbound/nn/linear.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/rmsnorm.h"
#include "peakbound/ops/rope.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
// Activations are f32 or bf16 (config.precision; the elem_bytes footprint forms take the
// size). Statistics (rstd, lse), RoPE tables, the kernel workspace and the bf16 path's
// running states (o32, dq32, dkv32, the linear tile) are f32 always.
const u64 kF32 = dtype_size(DType::f32);
const Component kC = Component::attention;

u64 U(std::int64_t v) { return static_cast<u64>(v); }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "attention layer buffer size"); }

AttentionDims dims_of(std::int64_t T, const AttentionLayerConfig& c) {
  AttentionDims d;
  d.tokens = T;
  d.q_heads = c.q_heads;
  d.kv_heads = c.kv_heads;
  d.qk_dim = c.head_dim;
  d.v_dim = c.head_dim;
  d.scale = 0.0f;  // 1 / sqrt(D), transformers' self.scaling = head_dim ** -0.5
  d.window = c.window;
  return d;
}

Buffer allocate(Device& dev, const BufferSpec& b) { return dev.allocate(b.component, b.bytes); }

Communicator& group_of(Communicator* g) {
  PB_CHECK_MSG(g != nullptr, "attention layer: cp > 1 needs set_cp_group before a call");
  return *g;
}

// The dims of one bf16 query chunk: n rows at q_offset r of a sequence, against its keys 0 .. r + n - 1.
AttentionDims chunk_dims(std::int64_t n, std::int64_t r, const AttentionLayerConfig& c, bool accumulate) {
  AttentionDims d = dims_of(n, c);
  d.q_offset = r;
  d.kv_tokens = r + n;
  d.accumulate = accumulate;
  return d;
}

}  // namespace

void check_attention_layer_config(const AttentionLayerConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument("attention layer: " + what); };
  if (c.hidden <= 0) bad("hidden must be positive (got " + std::to_string(c.hidden) + ")");
  if (c.q_heads <= 0) bad("q_heads must be positive (got " + std::to_string(c.q_heads) + ")");
  if (c.kv_heads <= 0 || c.q_heads % c.kv_heads != 0)
    bad("kv_heads must be positive and divide q_heads (got " + std::to_string(c.kv_heads) + " for " +
        std::to_string(c.q_heads) + " query heads)");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    bad("head_dim must be positive and even for RoPE (got " + std::to_string(c.head_dim) + ")");
  if (!(c.rope_theta > 0.0)) bad("rope_theta must be positive (got " + std::to_string(c.rope_theta) + ")");
  if (!(c.rms_eps >= 0.0f)) bad("rms_eps must be >= 0 (got " + std::to_string(c.rms_eps) + ")");
  if (c.seq_len < 0) bad("seq_len must be >= 0 (got " + std::to_string(c.seq_len) + ")");
  if (c.window < 0) bad("window must be >= 0 (got " + std::to_string(c.window) + ")");
  if (c.cp < 1 || c.cp_rank < 0 || c.cp_rank >= c.cp)
    bad("cp must be >= 1 and cp_rank in [0, cp) (got cp " + std::to_string(c.cp) + ", rank " +
        std::to_string(c.cp_rank) + ")");
  if (c.cp > 1 && c.seq_len != 0 && c.seq_len < 2 * static_cast<std::int64_t>(c.cp))
    bad("context parallel over " + std::to_string(c.cp) + " ranks needs sequences of at least " +
        std::to_string(2 * c.cp) + " tokens (2 chunks per rank), got seq_len " + std::to_string(c.seq_len));
}

std::int64_t attention_local_seq_len(const AttentionLayerConfig& c) {
  return c.cp > 1 ? zigzag_shard(c.seq_len, c.cp, c.cp_rank).tokens() : c.seq_len;
}

namespace {

// This rank's tokens per sequence of a T-token call; throws unless T is a whole number of sequences.
std::int64_t sequence_length(std::int64_t T, const AttentionLayerConfig& c) {
  if (c.seq_len == 0 && c.cp > 1)
    throw InvalidArgument("attention layer: context parallel needs the sequence length (seq_len 0)");
  if (c.seq_len == 0) return T;
  const std::int64_t n = attention_local_seq_len(c);
  if (T % n != 0)
    throw InvalidArgument("attention layer: " + std::to_string(T) + " tokens are not a whole number of sequences of " +
                          std::to_string(n) + (c.cp > 1 ? " (this rank's shard of " + std::to_string(c.seq_len) + ")" : ""));
  return n;
}

RingAttentionConfig ring_config(const AttentionLayerConfig& c) {
  RingAttentionConfig r;
  r.dims = dims_of(attention_local_seq_len(c), c);
  r.seq_len = c.seq_len;
  r.precision = c.precision;
  return r;
}

// Query rows of the bf16 path's fp32 states (o32, dq32) and of one kernel call: a chunk
// at cp = 1, this rank's whole shard under cp > 1 (the ring's out / dq).
std::int64_t state_rows(std::int64_t S, const AttentionLayerConfig& c) {
  return c.cp > 1 ? S : std::min(S, kAttentionChunkRows);
}

}  // namespace

AttentionLayerBuffers attention_layer_buffers(std::int64_t T, const AttentionLayerConfig& c, u64 a) {
  check_attention_layer_config(c);
  if (T < 0) throw InvalidArgument("attention layer: tokens must be >= 0 (got " + std::to_string(T) + ")");
  const u64 t = U(T), q = mul(U(c.q_heads), U(c.head_dim)), kv = mul(U(c.kv_heads), U(c.head_dim));
  const u64 qk = c.qk_norm ? 1 : 0;
  AttentionLayerBuffers b;
  b.h = buffer_spec(kC, mul(t, U(c.hidden)), a);
  b.rstd = buffer_spec(kC, t, kF32);
  b.q = buffer_spec(kC, mul(t, q), a);
  b.k = b.v = buffer_spec(kC, mul(t, kv), a);
  b.q_pre = buffer_spec(kC, mul(qk, mul(t, q)), a);
  b.k_pre = buffer_spec(kC, mul(qk, mul(t, kv)), a);
  b.q_rstd = buffer_spec(kC, mul(qk, mul(t, U(c.q_heads))), kF32);
  b.k_rstd = buffer_spec(kC, mul(qk, mul(t, U(c.kv_heads))), kF32);
  const std::int64_t S = sequence_length(T, c);
  b.rope_cos = b.rope_sin = buffer_spec(kC, U(ops::rope_table_elems(T > 0 ? S : 0, c.head_dim)), kF32);
  b.o = buffer_spec(kC, mul(t, q), a);
  b.lse = buffer_spec(kC, mul(t, U(c.q_heads)), kF32);
  // The kernel checks T >= 1; with no tokens there is no call and no workspace.
  // Under cp > 1 the ring attention call allocates its own (ring_attention_footprint).
  // Under bf16 each kernel call takes a chunk of queries and its tiles need bf16 room.
  const bool bf = c.precision == Precision::bf16;
  const AttentionDims d = dims_of(bf ? state_rows(S, c) : S, c);
  const DType wd = bf ? DType::bf16 : DType::f32;
  const bool kernel = T > 0 && c.cp == 1;
  b.workspace_forward = buffer_spec(kC, kernel ? U(attention_forward_workspace_floats(d, wd)) : 0, kF32);
  b.workspace_backward = buffer_spec(kC, kernel ? U(attention_backward_workspace_floats(d, false, wd)) : 0, kF32);
  b.d_o = b.dq = b.q;
  b.dk = b.dv = b.k;
  const u64 states = bf && T > 0 ? 1 : 0;
  b.tile = linear_tile_spec(T, std::max({c.hidden, c.q_heads * c.head_dim, c.kv_heads * c.head_dim}), c.precision, kC);
  b.o32 = b.dq32 = buffer_spec(kC, mul(states, mul(U(state_rows(S, c)), q)), kF32);
  b.dkv32 = buffer_spec(kC, mul(states, mul(U(S), mul(2, kv))), kF32);
  const u64 sinks = c.sinks && T > 0 ? 1 : 0;
  b.sinks32 = buffer_spec(kC, mul(sinks, U(c.q_heads)), kF32);
  b.sink_row_dot = buffer_spec(kC, mul(sinks, mul(U(S), U(c.q_heads))), kF32);
  return b;
}

AttentionLayerBuffers attention_layer_buffers(std::int64_t T, const AttentionLayerConfig& c) {
  return attention_layer_buffers(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint attention_layer_footprint(std::int64_t T, const AttentionLayerConfig& c) {
  return attention_layer_footprint(T, c, dtype_size(activation_dtype(c.precision)));
}

Footprint attention_layer_footprint(std::int64_t T, const AttentionLayerConfig& c, u64 elem_bytes) {
  const AttentionLayerBuffers b = attention_layer_buffers(T, c, elem_bytes);
  Footprint f("attention layer");
  for (const char* phase : {"forward", "backward"}) {
    const bool bwd = phase[0] == 'b';
    for (const BufferSpec& s : {b.h, b.rstd, b.q, b.k, b.v, b.q_pre, b.k_pre, b.q_rstd, b.k_rstd, b.rope_cos,
                                b.rope_sin, b.o, b.lse, b.tile, b.o32, b.sinks32})
      f.device(phase, s);
    f.device(phase, bwd ? b.workspace_backward : b.workspace_forward);
    if (bwd)
      for (const BufferSpec& s : {b.d_o, b.dq, b.dk, b.dv, b.dq32, b.dkv32, b.sink_row_dot}) f.device(phase, s);
  }
  // Ring attention's internals, live inside the kernel call of each phase.
  if (T > 0 && c.cp > 1) f.merge(ring_attention_footprint(ring_config(c), c.cp));
  return f;
}

AttentionLayer::AttentionLayer(Device& dev, const AttentionLayerConfig& config, const AttentionLayerTensors& params,
                               const AttentionLayerTensors& grads)
    : dev_(dev), cfg_(config), p_(params), g_(grads) {
  check_attention_layer_config(cfg_);
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Q = cfg_.q_heads * D, K = cfg_.kv_heads * D;
  const DType pd = param_dtype(cfg_.precision);
  DType want = pd;
  auto expect = [&want](const Tensor& t, const Shape& s, const char* name, const char* which) {
    expect_layer_tensor(t, s, want, "attention layer", which, name);
  };
  for (auto [t, which] : {std::pair{&p_, "parameter"}, std::pair{&g_, "gradient"}}) {
    want = t == &p_ ? pd : DType::f32;
    expect(t->w_in, Shape{H}, "w_in", which);
    expect(t->wq, Shape{Q, H}, "wq", which);
    expect(t->wk, Shape{K, H}, "wk", which);
    expect(t->wv, Shape{K, H}, "wv", which);
    expect(t->wo, Shape{H, Q}, "wo", which);
    if (cfg_.qk_norm) {
      expect(t->q_norm, Shape{D}, "q_norm", which);
      expect(t->k_norm, Shape{D}, "k_norm", which);
    }
    if (cfg_.qkv_bias) {
      expect(t->bq, Shape{Q}, "bq", which);
      expect(t->bk, Shape{K}, "bk", which);
      expect(t->bv, Shape{K}, "bv", which);
    }
    if (cfg_.out_bias) expect(t->bo, Shape{H}, "bo", which);
    if (cfg_.sinks) expect(t->sinks, Shape{cfg_.q_heads}, "sinks", which);
  }
}

void AttentionLayer::set_seq_len(std::int64_t s) {
  AttentionLayerConfig c = cfg_;
  c.seq_len = s;
  check_attention_layer_config(c);
  cfg_ = c;
}

void AttentionLayer::set_cp_group(Communicator* group) {
  if (group == nullptr || group->size() != cfg_.cp || group->rank() != cfg_.cp_rank)
    throw InvalidArgument("attention layer: the context-parallel group must have cp " + std::to_string(cfg_.cp) +
                          " ranks with this one at cp_rank " + std::to_string(cfg_.cp_rank));
  cp_group_ = group;
}

// RoPE tables of this rank's positions of one sequence: 0 .. S-1, or under cp the two
// zigzag chunks at their global positions, one after the other.
void AttentionLayer::rope_tables(float* cos, float* sin, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const std::int64_t D = cfg_.head_dim;
  if (cfg_.cp == 1) {
    ops::rope_tables(dev_, s, cos, sin, S, D, 0, cfg_.rope_theta, cfg_.rope_scaling);
    return;
  }
  const CpShard sh = zigzag_shard(cfg_.seq_len, cfg_.cp, cfg_.cp_rank);
  ops::rope_tables(dev_, s, cos, sin, sh.first.len, D, sh.first.begin, cfg_.rope_theta, cfg_.rope_scaling);
  const std::int64_t at = ops::rope_table_elems(sh.first.len, D);
  ops::rope_tables(dev_, s, cos + at, sin + at, sh.second.len, D, sh.second.begin, cfg_.rope_theta,
                   cfg_.rope_scaling);
}

std::int64_t AttentionLayer::check_shape(const Tensor& t, const char* what) const {
  return layer_activation_rows(t, cfg_.hidden, activation_dtype(cfg_.precision), "attention layer", what);
}

template <class A>
void AttentionLayer::attend_forward(Internals& in, std::int64_t b, std::int64_t S) {
  Stream& s = dev_.compute_stream();
  const std::int64_t Hq = cfg_.q_heads, Q = Hq * cfg_.head_dim, K = cfg_.kv_heads * cfg_.head_dim;
  const A *q = in.q.as<A>() + b * Q, *k = in.k.as<A>() + b * K, *v = in.v.as<A>() + b * K;
  A* o = in.o.as<A>() + b * Q;
  float* lse = in.lse.as<float>() + b * Hq;
  // The sinks join the finished rows' fp32 state (the kernel's or the ring's out and lse).
  const auto sink = [&](float* out, float* l, std::int64_t rows) {
    if (cfg_.sinks) ops::attention_sinks_forward(dev_, s, out, l, in.sinks32.as<float>(), rows, Hq, cfg_.head_dim);
  };
  if constexpr (std::is_same_v<A, float>) {
    if (cfg_.cp == 1)
      ops::attention_forward(dev_, s, o, lse, q, k, v, dims_of(S, cfg_), in.ws.as<float>());
    else
      ring_attention_forward(dev_, group_of(cp_group_), ring_config(cfg_), o, lse, q, k, v);
    sink(o, lse, S);
  } else {
    // fp32 out of up to R query rows at a time, narrowed once into o.
    float* o32 = in.o32.as<float>();
    if (cfg_.cp > 1) {
      ring_attention_forward(dev_, group_of(cp_group_), ring_config(cfg_), o32, lse, q, k, v);
      sink(o32, lse, S);
      ops::convert(dev_, s, o, o32, S * Q);
      return;
    }
    const std::int64_t R = state_rows(S, cfg_);
    for (std::int64_t r = 0; r < S; r += R) {
      const std::int64_t n = std::min(R, S - r);
      ops::attention_forward(dev_, s, o32, lse + r * Hq, q + r * Q, k, v, chunk_dims(n, r, cfg_, false),
                             in.ws.as<float>());
      sink(o32, lse + r * Hq, n);
      ops::convert(dev_, s, o + r * Q, o32, n * Q);
    }
  }
}

template <class A>
void AttentionLayer::attend_backward(Internals& in, std::int64_t b, std::int64_t S, const A* d_o, A* dq, A* dk, A* dv,
                                     float* dq32, float* dkv32) {
  Stream& s = dev_.compute_stream();
  const std::int64_t Hq = cfg_.q_heads, Q = Hq * cfg_.head_dim, K = cfg_.kv_heads * cfg_.head_dim;
  const A *q = in.q.as<A>() + b * Q, *k = in.k.as<A>() + b * K, *v = in.v.as<A>() + b * K;
  const A* o = in.o.as<A>() + b * Q;
  const float* lse = in.lse.as<float>() + b * Hq;
  d_o += b * Q;
  dq += b * Q;
  dk += b * K;
  dv += b * K;
  if constexpr (std::is_same_v<A, float>) {
    if (cfg_.cp == 1)
      ops::attention_backward(dev_, s, dq, dk, dv, d_o, q, k, v, o, lse, dims_of(S, cfg_), in.ws.as<float>());
    else
      ring_attention_backward(dev_, group_of(cp_group_), ring_config(cfg_), dq, dk, dv, d_o, q, k, v, o, lse);
  } else {
    // dk, dv: fp32 sums over every query chunk (or over the ring), narrowed once.
    float *dk32 = dkv32, *dv32 = dkv32 + S * K;
    if (cfg_.cp > 1) {
      ring_attention_backward(dev_, group_of(cp_group_), ring_config(cfg_), dq32, dk32, dv32, d_o, q, k, v, o, lse);
      ops::convert(dev_, s, dq, dq32, S * Q);
    } else {
      ops::fill(dev_, s, dkv32, 2 * S * K, 0.0f);
      const std::int64_t R = state_rows(S, cfg_);
      for (std::int64_t r = 0; r < S; r += R) {
        const std::int64_t n = std::min(R, S - r);
        ops::fill(dev_, s, dq32, n * Q, 0.0f);
        ops::attention_backward(dev_, s, dq32, dk32, dv32, d_o + r * Q, q + r * Q, k, v, o + r * Q, lse + r * Hq,
                                chunk_dims(n, r, cfg_, true), in.ws.as<float>());
        ops::convert(dev_, s, dq + r * Q, dq32, n * Q);
      }
    }
    ops::convert(dev_, s, dk, dk32, S * K);
    ops::convert(dev_, s, dv, dv32, S * K);
  }
}

// Allocates the forward's internals and computes them through o and lse. The
// workspace is the backward's when the caller is backward (one buffer either way).
template <class A>
void AttentionLayer::recompute(Internals& in, const A* x, std::int64_t T, bool for_backward) {
  const AttentionLayerBuffers b = attention_layer_buffers(T, cfg_);
  in.h = allocate(dev_, b.h);
  in.rstd = allocate(dev_, b.rstd);
  in.q = allocate(dev_, b.q);
  in.k = allocate(dev_, b.k);
  in.v = allocate(dev_, b.v);
  in.q_pre = allocate(dev_, b.q_pre);
  in.k_pre = allocate(dev_, b.k_pre);
  in.q_rstd = allocate(dev_, b.q_rstd);
  in.k_rstd = allocate(dev_, b.k_rstd);
  in.cos = allocate(dev_, b.rope_cos);
  in.sin = allocate(dev_, b.rope_sin);
  in.o = allocate(dev_, b.o);
  in.lse = allocate(dev_, b.lse);
  in.ws = allocate(dev_, for_backward ? b.workspace_backward : b.workspace_forward);
  in.tile = allocate(dev_, b.tile);  // bf16 only (else null)
  in.o32 = allocate(dev_, b.o32);
  in.sinks32 = allocate(dev_, b.sinks32);  // sinks only (else null)

  Stream& s = dev_.compute_stream();
  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = Hq * D, K = Hkv * D;
  float* tile = in.tile.as<float>();
  A* h = in.h.as<A>();
  ops::rmsnorm_forward(dev_, s, h, in.rstd.as<float>(), x, p_.w_in.data<A>(), T, H, cfg_.rms_eps);
  // With qk_norm the projections land in q_pre / k_pre (the norm's input, which its
  // backward reads) and the norm writes q / k; without, they land in q / k directly.
  A* qp = cfg_.qk_norm ? in.q_pre.as<A>() : in.q.as<A>();
  A* kp = cfg_.qk_norm ? in.k_pre.as<A>() : in.k.as<A>();
  // out [T, n] = h W^T (+ bias: every row starts as the bias, then the product adds).
  const auto project = [&](const Tensor& w, const Tensor& bias, std::int64_t n, A* out) {
    const bool biased = cfg_.qkv_bias;
    if (biased) ops::broadcast_rows(dev_, s, out, bias.data<A>(), T, n);
    linear(dev_, s, T, n, {{.a = h, .lda = H, .b = w.data<A>(), .ldb = H, .k = H, .trans_b = true}}, out, n,
           biased ? LinearMode::add : LinearMode::write, tile);
  };
  project(p_.wq, p_.bq, Q, qp);
  project(p_.wk, p_.bk, K, kp);
  project(p_.wv, p_.bv, K, in.v.as<A>());
  if (cfg_.qk_norm) {
    // [T, Hq, D] viewed as T*Hq rows of D: RMSNorm over each head's vector.
    ops::rmsnorm_forward(dev_, s, in.q.as<A>(), in.q_rstd.as<float>(), qp, p_.q_norm.data<A>(), T * Hq, D,
                         cfg_.rms_eps);
    ops::rmsnorm_forward(dev_, s, in.k.as<A>(), in.k_rstd.as<float>(), kp, p_.k_norm.data<A>(), T * Hkv, D,
                         cfg_.rms_eps);
  }
  if (cfg_.sinks) {
    if constexpr (std::is_same_v<A, float>)
      dev_.memcpy_async(in.sinks32.data(), p_.sinks.raw(), p_.sinks.nbytes(), CopyKind::device_to_device, s);
    else
      ops::convert(dev_, s, in.sinks32.as<float>(), p_.sinks.data<A>(), Hq);
  }
  const std::int64_t S = sequence_length(T, cfg_);
  rope_tables(in.cos.as<float>(), in.sin.as<float>(), S);
  for (std::int64_t b = 0; b < T; b += S) {
    ops::rope_forward(dev_, s, in.q.as<A>() + b * Q, in.k.as<A>() + b * K, in.cos.as<float>(), in.sin.as<float>(),
                      S, Hq, Hkv, D);
    attend_forward<A>(in, b, S);
  }
}

void AttentionLayer::forward(const Tensor& x, const Tensor& y) {
  if (cfg_.precision == Precision::bf16)
    forward_as<bf16>(x, y);
  else
    forward_as<float>(x, y);
}

template <class A>
void AttentionLayer::forward_as(const Tensor& x, const Tensor& y) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(y, "y") == T && (T == 0 || y.raw() != x.raw()),
               "attention layer: y must be a distinct [T, H]");
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  Internals in;
  recompute<A>(in, x.data<A>(), T, /*for_backward=*/false);
  // y = x + o Wo^T: the residual copy, then o_proj added into it (bf16: rounded once).
  const std::int64_t H = cfg_.hidden, Q = cfg_.q_heads * cfg_.head_dim;
  dev_.memcpy_async(y.raw(), x.raw(), x.nbytes(), CopyKind::device_to_device, s);
  if (cfg_.out_bias) ops::add_bias(dev_, s, y.data<A>(), p_.bo.data<A>(), T, H);
  linear(dev_, s, T, H, {{.a = in.o.as<A>(), .lda = Q, .b = p_.wo.data<A>(), .ldb = Q, .k = Q, .trans_b = true}},
         y.data<A>(), H, LinearMode::add, in.tile.as<float>());
  // The internals are freed on return: whatever reuses their memory next is ordered
  // after this work on the compute stream.
}

void AttentionLayer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (cfg_.precision == Precision::bf16)
    backward_as<bf16>(x, dy, dx);
  else
    backward_as<float>(x, dy, dx);
}

template <class A>
void AttentionLayer::backward_as(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::int64_t T = check_shape(x, "x");
  PB_CHECK_MSG(check_shape(dy, "dy") == T && check_shape(dx, "dx") == T, "attention layer: token counts differ");
  PB_CHECK_MSG(T == 0 || (dx.raw() != x.raw() && dx.raw() != dy.raw()), "attention layer: dx must not alias x or dy");
  if (T == 0) return;
  Stream& s = dev_.compute_stream();
  const A* xp = x.data<A>();
  const A* dyp = dy.data<A>();
  Internals in;
  recompute<A>(in, xp, T, /*for_backward=*/true);
  const AttentionLayerBuffers b = attention_layer_buffers(T, cfg_);
  Buffer d_o = allocate(dev_, b.d_o), dq = allocate(dev_, b.dq), dk = allocate(dev_, b.dk), dv = allocate(dev_, b.dv);
  Buffer dq32 = allocate(dev_, b.dq32), dkv32 = allocate(dev_, b.dkv32);  // bf16 only (else null)
  Buffer row_dot = allocate(dev_, b.sink_row_dot);                          // sinks only (else null)

  const std::int64_t H = cfg_.hidden, D = cfg_.head_dim, Hq = cfg_.q_heads, Hkv = cfg_.kv_heads;
  const std::int64_t Q = Hq * D, K = Hkv * D;
  A *h = in.h.as<A>(), *q = in.q.as<A>(), *k = in.k.as<A>();
  A *dqp = dq.as<A>(), *dkp = dk.as<A>(), *dvp = dv.as<A>();
  float* tile = in.tile.as<float>();

  // o_proj: dWo += dy^T o [H, Q] (dbo += colsum dy); d_o = dy Wo [T, Q].
  add_weight_grad(dev_, s, H, Q, T, dyp, in.o.as<A>(), g_.wo.data<float>());
  if (cfg_.out_bias) ops::add_column_sums(dev_, s, g_.bo.data<float>(), dyp, T, H);
  linear(dev_, s, T, Q, {{.a = dyp, .lda = H, .b = p_.wo.data<A>(), .ldb = Q, .k = H, .trans_b = false}},
         d_o.as<A>(), Q, LinearMode::write, tile);
  // Attention: dq, dk, dv (written), then RoPE's backward rotates dq, dk in place,
  // sequence by sequence (the workspace is one sequence's).
  const std::int64_t S = sequence_length(T, cfg_);
  for (std::int64_t b = 0; b < T; b += S) {
    if (cfg_.sinks) {  // dsinks from the merged lse and rowsum(d_o * o) of this sequence
      ops::attention_row_dot(dev_, s, row_dot.as<float>(), d_o.as<A>() + b * Q, in.o.as<A>() + b * Q,
                             dims_of(S, cfg_));
      ops::attention_sinks_backward(dev_, s, g_.sinks.data<float>(), in.lse.as<float>() + b * Hq,
                                    row_dot.as<float>(), in.sinks32.as<float>(), S, Hq);
    }
    attend_backward<A>(in, b, S, d_o.as<A>(), dqp, dkp, dvp, dq32.as<float>(), dkv32.as<float>());
    ops::rope_backward(dev_, s, dqp + b * Q, dkp + b * K, in.cos.as<float>(), in.sin.as<float>(), S, Hq, Hkv, D);
  }
  if (cfg_.qk_norm) {
    // The norm's backward adds into its dx: zero q and k (their last reader, the
    // attention backward, is done) and take the projections' gradients there.
    ops::fill(dev_, s, q, T * Q, 0.0f);
    ops::fill(dev_, s, k, T * K, 0.0f);
    ops::rmsnorm_backward(dev_, s, q, g_.q_norm.data<float>(), dqp, in.q_pre.as<A>(), p_.q_norm.data<A>(),
                          in.q_rstd.as<float>(), T * Hq, D);
    ops::rmsnorm_backward(dev_, s, k, g_.k_norm.data<float>(), dkp, in.k_pre.as<A>(), p_.k_norm.data<A>(),
                          in.k_rstd.as<float>(), T * Hkv, D);
    dqp = q;
    dkp = k;
  }
  // Projections: dW += d^T h, then dh = dq Wq + dk Wk + dv Wv into h's buffer (h is
  // read for the last time by the weight gradients, on the same stream, before).
  if (cfg_.qkv_bias) {
    ops::add_column_sums(dev_, s, g_.bq.data<float>(), dqp, T, Q);
    ops::add_column_sums(dev_, s, g_.bk.data<float>(), dkp, T, K);
    ops::add_column_sums(dev_, s, g_.bv.data<float>(), dvp, T, K);
  }
  add_weight_grad(dev_, s, Q, H, T, dqp, h, g_.wq.data<float>());
  add_weight_grad(dev_, s, K, H, T, dkp, h, g_.wk.data<float>());
  add_weight_grad(dev_, s, K, H, T, dvp, h, g_.wv.data<float>());
  A* dh = h;
  linear(dev_, s, T, H,
         {{.a = dqp, .lda = Q, .b = p_.wq.data<A>(), .ldb = H, .k = Q, .trans_b = false},
          {.a = dkp, .lda = K, .b = p_.wk.data<A>(), .ldb = H, .k = K, .trans_b = false},
          {.a = dvp, .lda = K, .b = p_.wv.data<A>(), .ldb = H, .k = K, .trans_b = false}},
         dh, H, LinearMode::write, tile);
  // dx = dy (the residual path) + input_layernorm's backward, which adds.
  dev_.memcpy_async(dx.raw(), dy.raw(), dy.nbytes(), CopyKind::device_to_device, s);
  ops::rmsnorm_backward(dev_, s, dx.data<A>(), g_.w_in.data<float>(), dh, xp, p_.w_in.data<A>(),
                        in.rstd.as<float>(), T, H);
}

std::vector<Parameter> AttentionLayer::parameters() const {
  std::vector<Parameter> out = {{"input_layernorm.weight", p_.w_in, g_.w_in},
                                {"q_proj.weight", p_.wq, g_.wq},
                                {"k_proj.weight", p_.wk, g_.wk},
                                {"v_proj.weight", p_.wv, g_.wv},
                                {"o_proj.weight", p_.wo, g_.wo}};
  if (cfg_.qk_norm) {
    out.push_back({"q_norm.weight", p_.q_norm, g_.q_norm});
    out.push_back({"k_norm.weight", p_.k_norm, g_.k_norm});
  }
  if (cfg_.qkv_bias) {
    out.push_back({"q_proj.bias", p_.bq, g_.bq});
    out.push_back({"k_proj.bias", p_.bk, g_.bk});
    out.push_back({"v_proj.bias", p_.bv, g_.bv});
  }
  if (cfg_.out_bias) out.push_back({"o_proj.bias", p_.bo, g_.bo});
  if (cfg_.sinks) out.push_back({"sinks", p_.sinks, g_.sinks});
  return out;
}

void AttentionLayer::zero_grad() {
  Stream& s = dev_.compute_stream();
  for (const Parameter& p : parameters()) ops::fill(dev_, s, p.grad.data<float>(), p.grad.numel(), 0.0f);
}

}  // namespace peakbound
