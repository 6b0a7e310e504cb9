// DeepSeek-V3's MoE sublayer (MoeLayer with sigmoid scoring, the score-correction bias,
// group-limited top-k, routed_scaling_factor and two shared experts) against transformers'
// own DeepseekV3MoE behind its post_attention_layernorm and residual
// (tests/fixtures/hf/deepseek_v3_parts, mlp.*, written by
// scripts/hf_reference/make_deepseek_fixture.py: 8 experts in 4 groups of 2, the best 2 groups
// kept, top-3, renormalised and times 2.5). The world's ranks split the 31 tokens round-robin
// and the experts over the largest EP that divides both the world and the 8 experts (replicas
// beyond); every dispatch kind, LLEP lending at any imbalance and the pipelined form in rounds
// of 3 token-copies. f32: y and dx rows to 1e-5 of max|ref|, every gradient (summed over the
// world) to 1e-5, and the layer's loads (token-copies per expert, summed over the world)
// equal to transformers' choice; bf16: y and dx to 3e-2, gradient cosines >= 0.999.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/layers/moe_layer.h"
#include "peakbound/ops/moe_router.h"
#include "tests/comm/world.h"
#include "tests/layers/layer_checks.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using layer_test::cosine;
using layer_test::max_relative;
using layer_test::put;
using layer_test::world_max_relative;
const auto get = layer_test::host;
using Vec = std::vector<float>;
using testing::world;

const SafeTensorsFile& fixture() {
  static const SafeTensorsFile f = SafeTensorsFile::open(
      std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/deepseek_v3_parts/deepseek_v3_parts.safetensors");
  return f;
}

constexpr std::int64_t kT = 31, kH = 24, kF = 10, kE = 8, kK = 3, kShared = 2;

Vec read(const std::string& name) { return fixture().read_f32("mlp." + name); }

std::string expert_name(std::int64_t e, const char* w) { return "mlp.experts." + std::to_string(e) + "." + w; }

// The checkpoint's experts (under prefix, "" or "grad.") as the layer's packed rows [E, 3FH].
Vec packed_experts(const std::string& prefix) {
  Vec out;
  for (std::int64_t e = 0; e < kE; ++e)
    for (const char* w : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
      const Vec t = read(prefix + expert_name(e, w));
      out.insert(out.end(), t.begin(), t.end());
    }
  return out;
}

MoeLayerConfig config(DispatchKind kind, Precision p) {
  MoeLayerConfig c;
  c.hidden = kH;
  c.ffn = kF;
  c.experts = kE;
  c.top_k = kK;
  c.norm_topk_prob = true;
  c.scoring = RouterScoring::sigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling = 2.5f;
  c.score_correction = true;
  c.shared_experts = kShared;
  c.shared_ffn = kF;
  c.rms_eps = 1e-6f;
  c.side_tile = 7;  // the shared experts over row tiles that do not divide the tokens
  c.kind = kind;
  c.dispatch.lambda = 1.0;
  c.dispatch.min_spill = 1;
  c.dispatch.cap = 3;
  c.precision = p;
  return c;
}

void run(DispatchKind kind, Precision p) {
  Communicator& w = world();
  const int W = w.size(), r = w.rank();
  int ep = 1;
  for (int d = 1; d <= W; ++d)
    if (W % d == 0 && kE % d == 0) ep = d;
  std::unique_ptr<Communicator> g = w.split(r / ep, r);
  const std::int64_t per = kE / ep, first = g->rank() * per, EF = 3 * kF * kH, Fs = kShared * kF;
  const bool bf = p == Precision::bf16;
  const DType pd = param_dtype(p), ad = activation_dtype(p);
  SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " " + std::string(precision_name(p)) + " ep " +
               std::to_string(ep));

  std::vector<std::int64_t> rows;
  for (std::int64_t t = r; t < kT; t += W) rows.push_back(t);
  const auto T = static_cast<std::int64_t>(rows.size());
  auto pick = [&](const Vec& all) {
    Vec out;
    for (std::int64_t t : rows) out.insert(out.end(), all.begin() + t * kH, all.begin() + (t + 1) * kH);
    return out;
  };

  CpuDevice dev(64 << 20);
  std::vector<Buffer> keep;
  const Vec experts = packed_experts("");
  const Vec mine(experts.begin() + first * EF, experts.begin() + (first + per) * EF);
  MoeLayerTensors pt, gt;
  pt.w_post = put(dev, keep, read("post_attention_layernorm.weight"), Shape{kH}, pd, Component::params);
  pt.w_gate = put(dev, keep, read("mlp.gate.weight"), Shape{kE, kH}, pd, Component::params);
  pt.experts = put(dev, keep, mine, Shape{per, EF}, pd, Component::params);
  pt.shared_gate = put(dev, keep, read("mlp.shared_experts.gate_proj.weight"), Shape{Fs, kH}, pd, Component::params);
  pt.shared_up = put(dev, keep, read("mlp.shared_experts.up_proj.weight"), Shape{Fs, kH}, pd, Component::params);
  pt.shared_down = put(dev, keep, read("mlp.shared_experts.down_proj.weight"), Shape{kH, Fs}, pd, Component::params);
  pt.correction = put(dev, keep, read("mlp.gate.e_score_correction_bias"), Shape{kE}, DType::f32, Component::params);
  pt.loads = put(dev, keep, {}, Shape{kE}, DType::f32, Component::workspace);
  gt.w_post = put(dev, keep, {}, Shape{kH}, DType::f32, Component::grads);
  gt.w_gate = put(dev, keep, {}, Shape{kE, kH}, DType::f32, Component::grads);
  gt.experts = put(dev, keep, {}, Shape{per, EF}, DType::f32, Component::grads);
  gt.shared_gate = put(dev, keep, {}, Shape{Fs, kH}, DType::f32, Component::grads);
  gt.shared_up = put(dev, keep, {}, Shape{Fs, kH}, DType::f32, Component::grads);
  gt.shared_down = put(dev, keep, {}, Shape{kH, Fs}, DType::f32, Component::grads);
  MoeLayer layer(dev, *g, config(kind, p), pt, gt, nullptr);
  const Shape s{T, kH};
  const Tensor x = put(dev, keep, pick(read("x")), s, ad, Component::workspace);
  const Tensor dy = put(dev, keep, pick(read("dy")), s, ad, Component::workspace);
  const Tensor y = put(dev, keep, {}, s, ad, Component::workspace), dx = put(dev, keep, {}, s, ad, Component::workspace);
  layer.forward(x, y);
  layer.backward(x, dy, dx);  // the recompute adds no loads
  dev.synchronize();

  for (auto [got, name] : {std::pair{get(y), "y"}, std::pair{get(dx), "dx"}}) {
    EXPECT_LE(world_max_relative(w, got, pick(read(name))), bf ? 3e-2 : 1e-5) << name;
  }
  Vec loads = get(pt.loads);
  w.all_reduce(loads.data(), loads.size(), DType::f32, ReduceOp::sum);
  if (!bf) {  // bf16 may route a near-tie differently
    EXPECT_EQ(loads, read("loads"));
  }

  Vec ge(static_cast<std::size_t>(kE * EF), 0.0f);
  const Vec local = get(gt.experts);
  std::copy(local.begin(), local.end(), ge.begin() + first * EF);
  w.all_reduce(ge.data(), ge.size(), DType::f32, ReduceOp::sum);
  std::vector<std::pair<std::string, Vec>> grads = {{"post_attention_layernorm.weight", get(gt.w_post)},
                                                    {"mlp.gate.weight", get(gt.w_gate)},
                                                    {"mlp.shared_experts.gate_proj.weight", get(gt.shared_gate)},
                                                    {"mlp.shared_experts.up_proj.weight", get(gt.shared_up)},
                                                    {"mlp.shared_experts.down_proj.weight", get(gt.shared_down)}};
  for (auto& [n, v] : grads) w.all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
  for (std::int64_t e = 0; e < kE; ++e) {
    const char* names[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    for (int k = 0; k < 3; ++k) {
      const auto at = ge.begin() + e * EF + k * kF * kH;
      grads.push_back({expert_name(e, names[k]), Vec(at, at + kF * kH)});
    }
  }
  double worst = 0, worst_cos = 1;
  for (const auto& [n, v] : grads) {
    const Vec ref = read("grad." + n);
    const double e = max_relative(v, ref), c = cosine(v, ref);
    if (bf)
      EXPECT_GE(c, 0.999) << n;
    else
      EXPECT_LE(e, 1e-5) << n;
    worst = std::max(worst, e);
    worst_cos = std::min(worst_cos, c);
  }
  if (r == 0)
    std::printf("deepseek-v3 mlp %s %s at %d ranks (ep %d): worst gradient %.3g of max|ref|, cosine %.6f\n",
                std::string(dispatch_kind_name(kind)).c_str(), std::string(precision_name(p)).c_str(), W, ep, worst,
                worst_cos);
}

TEST(MoeLayerDeepseek, MatchesTransformersEveryDispatchBothPrecisions) {
  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep})
    for (Precision p : {Precision::f32, Precision::bf16}) run(kind, p);
}

// What the layer refuses, one line each.
TEST(MoeLayerDeepseek, RefusesRoutingThatDoesNotFit) {
  MoeLayerConfig c = config(DispatchKind::standard_ep, Precision::f32);
  c.n_group = 3;  // does not divide 8 experts
  EXPECT_THROW(check_moe_layer_config(c), InvalidArgument);
  c = config(DispatchKind::standard_ep, Precision::f32);
  c.top_k = 5;  // more than the 2 kept groups' 4 experts
  EXPECT_THROW(check_moe_layer_config(c), InvalidArgument);
  c = config(DispatchKind::standard_ep, Precision::f32);
  c.scoring = RouterScoring::softmax;  // correction and scaling need sigmoid scoring
  EXPECT_THROW(check_moe_layer_config(c), InvalidArgument);
  c = config(DispatchKind::standard_ep, Precision::f32);
  c.routed_scaling = 0.0f;
  EXPECT_THROW(check_moe_layer_config(c), InvalidArgument);
}

// The auxiliary-loss-free update through ops:: moves each expert's correction by the sign
// of its load's distance from the mean.
TEST(MoeLayerDeepseek, BiasUpdateFollowsTheLoadError) {
  CpuDevice dev(1 << 20);
  Buffer b = dev.allocate(Component::workspace, 4 * 4), l = dev.allocate(Component::workspace, 4 * 4);
  const float bias[4] = {0.0f, 0.5f, -0.25f, 1.0f}, load[4] = {3.0f, 1.0f, 2.0f, 2.0f};  // mean 2
  std::copy(bias, bias + 4, b.as<float>());
  std::copy(load, load + 4, l.as<float>());
  ops::moe_router_bias_update(dev, dev.compute_stream(), b.as<float>(), l.as<float>(), 4, 0.001f);
  dev.synchronize();
  EXPECT_EQ(b.as<float>()[0], 0.0f - 0.001f);
  EXPECT_EQ(b.as<float>()[1], 0.5f + 0.001f);
  EXPECT_EQ(b.as<float>()[2], -0.25f);
  EXPECT_EQ(b.as<float>()[3], 1.0f);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
