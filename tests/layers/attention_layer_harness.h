// What the attention layer's bf16 test and its context-parallel test share: inputs drawn
// as floats exactly representable in bf16 (so the f32 and the bf16 layer see the same
// values), moved to and from device buffers of either dtype, and one layer built on its
// own CPU device and run forward then backward, the Arena's attention peak of each call
// checked against attention_layer_footprint and nothing left live.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/schedules/ring_attention.h"

namespace peakbound::attention_test {

// A call's Arena peak of component c by the footprint: the largest of the phases it runs
// (attention_call_phases: a backward's recomputation runs the forward's, or none of them
// when it takes the o and lse forward_for_backward kept).
inline std::uint64_t call_peak(const Footprint& f, Component c, std::int64_t T, const AttentionLayerConfig& cfg,
                               AttentionCall call) {
  std::uint64_t w = 0;
  for (std::string_view p : attention_call_phases(T, cfg, call))
    w = std::max(w, f.phase(p).device[static_cast<std::size_t>(c)]);
  return w;
}

using Vec = std::vector<float>;

// n values of N(mean, sd), rounded to bf16 and widened.
inline Vec draw(std::int64_t n, std::mt19937& rng, double mean, double sd) {
  std::normal_distribution<double> d(mean, sd);
  Vec v(static_cast<std::size_t>(n));
  for (float& x : v) x = to_f32(to_bf16(static_cast<float>(d(rng))));
  return v;
}

// A buffer of `v` in dtype t (bf16: narrowed, exact for drawn values); at least 4 bytes.
inline Buffer upload(Device& dev, Component comp, const Vec& v, DType t) {
  Buffer b = dev.allocate(comp, std::max<std::uint64_t>(v.size() * dtype_size(t), 4));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::bf16)
      b.as<bf16>()[i] = to_bf16(v[i]);
    else
      b.as<float>()[i] = v[i];
  }
  return b;
}

// The first n elements of b (dtype t), widened.
inline Vec download(const Buffer& b, std::size_t n, DType t) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = t == DType::bf16 ? to_f32(b.as<bf16>()[i]) : b.as<float>()[i];
  return v;
}

// The config of a layer of hidden H, Hq / Hkv heads of D, over sequences of S tokens (0:
// the call is one sequence), in precision p, cp 1.
inline AttentionLayerConfig config(std::int64_t H, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, bool qk_norm,
                                   std::int64_t S, Precision p) {
  AttentionLayerConfig cfg;
  cfg.hidden = H;
  cfg.q_heads = Hq;
  cfg.kv_heads = Hkv;
  cfg.head_dim = D;
  cfg.qk_norm = qk_norm;
  cfg.seq_len = S;
  cfg.precision = p;
  return cfg;
}

// The tensors of AttentionLayerTensors in AttentionLayer::parameters() order, each with its
// shape, for the config's optional parts (q_norm, k_norm with qk_norm; bq, bk, bv with
// qkv_bias; bo with out_bias; sinks with sinks).
struct ParamSlot {
  Tensor AttentionLayerTensors::*member;
  Shape shape;
  bool norm;  // an RMSNorm weight (drawn around 1)
};
inline std::vector<ParamSlot> param_slots(const AttentionLayerConfig& c) {
  const std::int64_t H = c.hidden, D = c.head_dim, Q = c.q_heads * D, K = c.kv_heads * D;
  using T = AttentionLayerTensors;
  if (c.mla) {  // AttentionLayer::parameters()'s MLA order
    const std::int64_t Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, dr = c.qk_rope_dim;
    const std::int64_t Qm = c.q_heads * (c.qk_nope_dim + dr), O = c.q_heads * c.v_dim;
    std::vector<ParamSlot> s = {{&T::w_in, Shape{H}, true}};
    if (Rq > 0) {
      s.push_back({&T::wqa, Shape{Rq, H}, false});
      if (c.qkv_bias) s.push_back({&T::bqa, Shape{Rq}, false});
      s.push_back({&T::q_a_norm, Shape{Rq}, true});
      s.push_back({&T::wqb, Shape{Qm, Rq}, false});
    } else {
      s.push_back({&T::wq, Shape{Qm, H}, false});
    }
    s.push_back({&T::wkva, Shape{Rkv + dr, H}, false});
    if (c.qkv_bias) s.push_back({&T::bkva, Shape{Rkv + dr}, false});
    s.push_back({&T::kv_a_norm, Shape{Rkv}, true});
    s.push_back({&T::wkvb, Shape{c.q_heads * (c.qk_nope_dim + c.v_dim), Rkv}, false});
    s.push_back({&T::wo, Shape{H, O}, false});
    if (c.out_bias) s.push_back({&T::bo, Shape{H}, false});
    return s;
  }
  std::vector<ParamSlot> s = {{&T::w_in, Shape{H}, true},
                              {&T::wq, Shape{Q, H}, false},
                              {&T::wk, Shape{K, H}, false},
                              {&T::wv, Shape{K, H}, false},
                              {&T::wo, Shape{H, Q}, false}};
  if (c.qk_norm) s.insert(s.end(), {{&T::q_norm, Shape{D}, true}, {&T::k_norm, Shape{D}, true}});
  if (c.qkv_bias) s.insert(s.end(), {{&T::bq, Shape{Q}, false}, {&T::bk, Shape{K}, false}, {&T::bv, Shape{K}, false}});
  if (c.out_bias) s.push_back({&T::bo, Shape{H}, false});
  if (c.sinks) s.push_back({&T::sinks, Shape{c.q_heads}, false});
  return s;
}

inline std::vector<Shape> param_shapes(const AttentionLayerConfig& c) {
  std::vector<Shape> s;
  for (const ParamSlot& p : param_slots(c)) s.push_back(p.shape);
  return s;
}

// The parameters drawn in that order: norm weights around 1, projections at nn.Linear's
// scale 1 / sqrt(fan_in), biases and sinks N(0, 0.5).
inline std::vector<Vec> draw_params(const AttentionLayerConfig& c, std::mt19937& rng) {
  std::vector<Vec> params;
  for (const ParamSlot& p : param_slots(c)) {
    const Shape& s = p.shape;
    params.push_back(draw(s.numel(), rng, p.norm ? 1.0 : 0.0,
                          p.norm ? 0.1 : s.ndim() == 1 ? 0.5 : 1.0 / std::sqrt(double(s[1]))));
  }
  return params;
}

// The layer's parameters uploaded (param_dtype) and zero fp32 gradients, as views.
struct LayerParams {
  std::vector<Buffer> pb, gb;
  AttentionLayerTensors pt, gt;
};
inline LayerParams upload_params(Device& dev, const AttentionLayerConfig& cfg, const std::vector<Vec>& params) {
  const DType w = param_dtype(cfg.precision);
  LayerParams lp;
  const std::vector<ParamSlot> slots = param_slots(cfg);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    lp.pb.push_back(upload(dev, Component::params, params[i], w));
    lp.gb.push_back(upload(dev, Component::grads, Vec(static_cast<std::size_t>(slots[i].shape.numel()), 0.0f),
                           DType::f32));
    lp.pt.*slots[i].member = lp.pb.back().tensor(slots[i].shape, w);
    lp.gt.*slots[i].member = lp.gb.back().tensor(slots[i].shape, DType::f32);
  }
  return lp;
}

struct Result {
  Vec y, dx;
  std::vector<Vec> grads;  // fp32, parameters() order
  std::uint64_t forward_ring_bytes = 0, backward_ring_bytes = 0;  // this rank's ring sends in each call
};

// y, dx and every gradient bit for bit.
inline void expect_same_bits(const Result& got, const Result& want) {
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.dx, want.dx);
  EXPECT_EQ(got.grads, want.grads);
}

// One forward and `backwards` backward calls of the layer of cfg (parameters `params` in
// param_dtype, zero fp32 gradients) on rows x, dy [T, H] in activation_dtype; g: the
// cp group (cfg.cp > 1), else null. Checks each call's Arena attention peak against the
// footprint and that nothing stays live. keep: the forward is forward_for_backward, which
// leaves exactly the footprint's "kept" bytes live for the first backward. in_place: the
// forward writes y over its input (a copy of x; the backward reads the original).
// rows > 0: the forward is forward_for_rows (the footprint's "kept" bytes left live), then
// forward_rows writes y `rows` rows a call (each call's peak the footprint's "rows"), then
// the backward takes the kept o and lse.
inline Result run_layer(const AttentionLayerConfig& cfg, const std::vector<Vec>& params, const Vec& x, const Vec& dy,
                        Communicator* g = nullptr, int backwards = 1, bool keep = false, bool in_place = false,
                        std::int64_t rows = 0) {
  const DType a = activation_dtype(cfg.precision);
  CpuDevice dev(256ull << 20);
  const LayerParams lp = upload_params(dev, cfg, params);
  const std::vector<Shape> shapes = param_shapes(cfg);
  AttentionLayer layer(dev, cfg, lp.pt, lp.gt);
  if (g) layer.set_cp_group(g);
  HostMemory host;
  AttentionOutputHost out_host(host);  // output_on_host: o's area
  layer.set_output_host(&out_host);
  const std::int64_t T = static_cast<std::int64_t>(x.size()) / cfg.hidden;
  const Footprint f = attention_layer_footprint(T, cfg);
  const Shape s{T, cfg.hidden};
  Buffer xb = upload(dev, Component::workspace, x, a), dyb = upload(dev, Component::workspace, dy, a);
  Buffer yb = upload(dev, Component::workspace, x, a), dxb = upload(dev, Component::workspace, x, a);
  const auto at = static_cast<std::size_t>(Component::attention);
  auto check = [&](const char* call, std::uint64_t peak, std::uint64_t live) {
    EXPECT_EQ(dev.arena().peak(Component::attention), peak) << call;
    EXPECT_EQ(dev.arena().live(Component::attention), live) << call;
  };
  Result r;
  dev.arena().reset_peaks();
  std::uint64_t sent = ring_attention_bytes_sent();
  if (rows > 0) {
    layer.forward_for_rows(xb.tensor(s, a));
    check("forward_for_rows", call_peak(f, Component::attention, T, cfg, AttentionCall::forward_for_rows),
          T > 0 ? f.phase("kept").device[at] : 0);
    for (std::int64_t first = 0; first < T; first += rows) {
      dev.arena().reset_peaks();
      const std::int64_t n = std::min(rows, T - first);
      layer.forward_rows(xb.tensor(s, a), first, n, static_cast<char*>(yb.data()) + first * cfg.hidden * dtype_size(a));
      check("forward_rows", f.phase("rows").device[at], f.phase("kept").device[at]);
    }
    keep = true;  // the backward takes what forward_for_rows kept
  } else if (keep)
    layer.forward_for_backward(xb.tensor(s, a), yb.tensor(s, a));
  else if (in_place)
    layer.forward(yb.tensor(s, a), yb.tensor(s, a));  // yb holds x until the forward writes y there
  else
    layer.forward(xb.tensor(s, a), yb.tensor(s, a));
  if (rows == 0)
    check("forward", call_peak(f, Component::attention, T, cfg, AttentionCall::forward),
          keep && T > 0 ? f.phase("kept").device[at] : 0);
  r.forward_ring_bytes = ring_attention_bytes_sent() - sent;
  for (int i = 0; i < backwards; ++i) {
    dev.arena().reset_peaks();
    sent = ring_attention_bytes_sent();
    layer.backward(xb.tensor(s, a), dyb.tensor(s, a), dxb.tensor(s, a));
    // The first backward after forward_for_backward skips the kernel's forward.
    check("backward",
          call_peak(f, Component::attention, T, cfg,
                    keep && i == 0 ? AttentionCall::backward_taking_kept : AttentionCall::backward),
          0);
    if (i == 0) r.backward_ring_bytes = ring_attention_bytes_sent() - sent;
  }
  dev.synchronize();
  // The host holds o only while o_proj has not read it: nothing of the area is counted by
  // a call (the caller owns it), and it is the size the call says.
  EXPECT_EQ(out_host.bytes(), arena_reserved(attention_output_host_bytes(T, cfg)));
  EXPECT_EQ(host.peak(Component::attention), out_host.bytes());
  r.y = download(yb, x.size(), a);
  r.dx = download(dxb, x.size(), a);
  for (std::size_t i = 0; i < shapes.size(); ++i)
    r.grads.push_back(download(lp.gb[i], static_cast<std::size_t>(shapes[i].numel()), DType::f32));
  return r;
}

}  // namespace peakbound::attention_test
