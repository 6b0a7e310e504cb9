// What the FFN sublayer's tests (moe_layer_test.cc, moe_layer_bf16_test.cc,
// moe_layer_mpi_test.cc) share: a case's shape and its config, and the reference's
// double values (moe_layer_reference.h) placed as device tensors in either dtype (the
// parameters, zero gradients, an expert-parallel rank's slice of the experts) and read back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peakbound/device/device.h"
#include "peakbound/layers/moe_layer.h"
#include "tests/layers/layer_checks.h"
#include "tests/layers/moe_layer_reference.h"

namespace peakbound::moe_test {

using layer_test::host;  // a device tensor (f32 or bf16) as floats
using moe_ref::Params;
using moe_ref::Vec;

// One test case: T tokens of hidden H; E experts of width F, top K (norm: renormalized);
// S shared experts of width Fs (gate: the gated shared expert); dense > 0: the dense
// FFN of that width instead; hot >= 0: every token's first choice is that expert; tile:
// the side SwiGLU's row tile.
struct Case {
  std::int64_t T = 0, H = 20, F = 6, E = 8, K = 2;
  bool norm = true;
  std::int64_t S = 0, Fs = 0;
  bool gate = false;
  std::int64_t dense = 0;
  int hot = -1;
  std::int64_t tile = kSideFfnTileRows;
  std::int64_t seq_tile = 0;  // MoeLayerConfig::seq_tile: the whole sublayer's row tile
  std::string str() const {
    return "T=" + std::to_string(T) + " H=" + std::to_string(H) + " F=" + std::to_string(F) + " E=" +
           std::to_string(E) + " K=" + std::to_string(K) + " norm=" + std::to_string(norm) + " S=" +
           std::to_string(S) + " Fs=" + std::to_string(Fs) + " gate=" + std::to_string(gate) + " dense=" +
           std::to_string(dense) + " hot=" + std::to_string(hot) + " tile=" + std::to_string(tile) +
           " seq_tile=" + std::to_string(seq_tile);
  }
  MoeLayerConfig config(Precision p = Precision::f32) const {
    MoeLayerConfig c;
    c.hidden = H;
    c.dense_ffn = dense;
    c.ffn = F;
    c.experts = E;
    c.top_k = K;
    c.norm_topk_prob = norm;
    c.shared_experts = S;
    c.shared_ffn = Fs;
    c.shared_gate = gate;
    c.rms_eps = 1e-6f;
    c.side_tile = tile;
    c.seq_tile = seq_tile;
    c.precision = p;
    return c;
  }
};

// A device tensor of shape s in dtype dt holding src from element `offset` (each value
// rounded to float, then to bf16 under bf16), or zeros (src null); its buffer is kept in keep.
inline Tensor put(Device& dev, std::vector<Buffer>& keep, Component comp, Shape s, const Vec* src,
                  DType dt = DType::f32, std::int64_t offset = 0) {
  keep.push_back(dev.allocate(comp, static_cast<std::uint64_t>(s.numel()) * dtype_size(dt)));
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    const float v = src ? static_cast<float>((*src)[static_cast<std::size_t>(offset + i)]) : 0.0f;
    if (dt == DType::bf16)
      keep.back().as<bf16>()[i] = to_bf16(v);
    else
      keep.back().as<float>()[i] = v;
  }
  return Tensor(keep.back().data(), s, dt, Location::device);
}

// Every parameter of c from P (zero: zero gradients of the same shapes) in dt, with the
// experts [first, first + count) (count < 0: all E) as an expert-parallel rank holds them.
inline MoeLayerTensors tensors(Device& dev, std::vector<Buffer>& keep, Component comp, const MoeLayerConfig& c,
                               const Params& P, bool zero, DType dt = DType::f32, std::int64_t first = 0,
                               std::int64_t count = -1) {
  const std::int64_t H = c.hidden, W = c.side_ffn(), X = 3 * c.ffn * H;
  auto src = [&](const Vec& v) { return zero ? nullptr : &v; };
  MoeLayerTensors t;
  t.w_post = put(dev, keep, comp, Shape{H}, src(P.w_post), dt);
  if (c.dense()) {
    t.dense_gate = put(dev, keep, comp, Shape{W, H}, src(P.dense_gate), dt);
    t.dense_up = put(dev, keep, comp, Shape{W, H}, src(P.dense_up), dt);
    t.dense_down = put(dev, keep, comp, Shape{H, W}, src(P.dense_down), dt);
    return t;
  }
  if (count < 0) count = c.experts;
  t.w_gate = put(dev, keep, comp, Shape{c.experts, H}, src(P.w_gate), dt);
  t.experts = put(dev, keep, comp, Shape{count, X}, src(P.experts), dt, first * X);
  if (c.shared_experts > 0) {
    t.shared_gate = put(dev, keep, comp, Shape{W, H}, src(P.shared_gate), dt);
    t.shared_up = put(dev, keep, comp, Shape{W, H}, src(P.shared_up), dt);
    t.shared_down = put(dev, keep, comp, Shape{H, W}, src(P.shared_down), dt);
  }
  if (c.shared_gate) t.shared_expert_gate = put(dev, keep, comp, Shape{1, H}, src(P.shared_expert_gate), dt);
  return t;
}

}  // namespace peakbound::moe_test
