// gpt-oss's MoE sublayer (MoeLayer with router_bias, expert_bias and the clamped SwiGLU)
// against transformers' own GptOssMLP behind its post_attention_layernorm and residual
// (tests/fixtures/hf/gpt_oss_parts, mlp.*, written by scripts/hf_reference/make_gptoss_fixture.py:
// the router's bias and softmax over the top-k logits, the fused interleaved experts with
// their biases, 8% of the gate / up values at or past the clamp). The checkpoint's experts go
// through gpt_oss_pack_expert into the trainer's packed rows and the gradients come back
// through gpt_oss_unpack_expert, so the conversion the loader will use is checked with them.
// The world's ranks split the 29 tokens round-robin and the experts over the largest EP that
// divides both the world and the 6 experts (EP 1-3; replicas beyond); every dispatch kind, LLEP
// lending at any imbalance and the pipelined form in rounds of 3 token-copies. y
// and dx rows to 1e-5 of max|ref| in f32, every gradient (summed over the world) to 1e-5;
// bf16: y and dx to 3e-2, gradient cosines >= 0.999.
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
#include "peakbound/train/gpt_oss_experts.h"
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
  static const SafeTensorsFile f = SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) +
                                                         "/tests/fixtures/hf/gpt_oss_parts/gpt_oss_parts.safetensors");
  return f;
}

constexpr std::int64_t kT = 29, kH = 24, kF = 13, kE = 6, kK = 2;

Vec read(const std::string& name) { return fixture().read_f32("mlp." + name); }

// The experts of the checkpoint tensors (under prefix, "" or "grad.") as packed rows [E, EF].
Vec packed_experts(const std::string& prefix) {
  const Vec gu = read(prefix + "mlp.experts.gate_up_proj"), gub = read(prefix + "mlp.experts.gate_up_proj_bias");
  const Vec d = read(prefix + "mlp.experts.down_proj"), db = read(prefix + "mlp.experts.down_proj_bias");
  const std::int64_t EF = gpt_oss_expert_floats(kH, kF);
  Vec out(static_cast<std::size_t>(kE * EF));
  for (std::int64_t e = 0; e < kE; ++e)
    gpt_oss_pack_expert(out.data() + e * EF, gu.data() + e * kH * 2 * kF, gub.data() + e * 2 * kF,
                        d.data() + e * kF * kH, db.data() + e * kH, kH, kF);
  return out;
}

MoeLayerConfig config(DispatchKind kind, Precision p) {
  MoeLayerConfig c;
  c.hidden = kH;
  c.ffn = kF;
  c.experts = kE;
  c.top_k = kK;
  c.norm_topk_prob = true;  // softmax over the top-k logits
  c.rms_eps = 1e-5f;        // GptOssConfig's rms_norm_eps
  c.router_bias = c.expert_bias = c.clamped = true;
  c.clamp = ops::SwigluClamp{1.702f, 7.0f};
  c.kind = kind;
  // LLEP lends at any imbalance and in pieces of one token-copy, pipelined runs rounds of 3
  // copies: the experts' biases travel with their weights and the rounds cut the batch.
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
  const std::int64_t per = kE / ep, first = g->rank() * per, EF = gpt_oss_expert_floats(kH, kF);
  const bool bf = p == Precision::bf16;
  const DType pd = param_dtype(p), ad = activation_dtype(p);
  SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " " + std::string(precision_name(p)) + " ep " +
               std::to_string(ep));

  // This rank's tokens: rows r, r + W, ...
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
  pt.w_gate = put(dev, keep, read("mlp.router.weight"), Shape{kE, kH}, pd, Component::params);
  pt.w_gate_bias = put(dev, keep, read("mlp.router.bias"), Shape{kE}, pd, Component::params);
  pt.experts = put(dev, keep, mine, Shape{per, EF}, pd, Component::params);
  gt.w_post = put(dev, keep, {}, Shape{kH}, DType::f32, Component::grads);
  gt.w_gate = put(dev, keep, {}, Shape{kE, kH}, DType::f32, Component::grads);
  gt.w_gate_bias = put(dev, keep, {}, Shape{kE}, DType::f32, Component::grads);
  gt.experts = put(dev, keep, {}, Shape{per, EF}, DType::f32, Component::grads);
  MoeLayer layer(dev, *g, config(kind, p), pt, gt, nullptr);
  const Shape s{T, kH};
  const Tensor x = put(dev, keep, pick(read("x")), s, ad, Component::workspace);
  const Tensor dy = put(dev, keep, pick(read("dy")), s, ad, Component::workspace);
  const Tensor y = put(dev, keep, {}, s, ad, Component::workspace), dx = put(dev, keep, {}, s, ad, Component::workspace);
  layer.forward(x, y);
  layer.backward(x, dy, dx);
  dev.synchronize();

  // y and dx: this rank's rows against the fixture's (the largest error over the world).
  for (auto [got, name] : {std::pair{get(y), "y"}, std::pair{get(dx), "dx"}}) {
    EXPECT_LE(world_max_relative(w, got, pick(read(name))), bf ? 3e-2 : 1e-5) << name;
  }
  // Gradients summed over the world; the experts' placed at their global rows first.
  Vec ge(static_cast<std::size_t>(kE * EF), 0.0f);
  const Vec local = get(gt.experts);
  std::copy(local.begin(), local.end(), ge.begin() + first * EF);
  std::vector<std::pair<std::string, Vec>> grads = {{"post_attention_layernorm.weight", get(gt.w_post)},
                                                    {"mlp.router.weight", get(gt.w_gate)},
                                                    {"mlp.router.bias", get(gt.w_gate_bias)}};
  for (auto& [n, v] : grads) w.all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
  w.all_reduce(ge.data(), ge.size(), DType::f32, ReduceOp::sum);
  // The packed expert gradients back in the checkpoint's layout, tensor by tensor.
  Vec gu(static_cast<std::size_t>(kE * kH * 2 * kF)), gub(static_cast<std::size_t>(kE * 2 * kF));
  Vec d(static_cast<std::size_t>(kE * kF * kH)), db(static_cast<std::size_t>(kE * kH));
  for (std::int64_t e = 0; e < kE; ++e)
    gpt_oss_unpack_expert(ge.data() + e * EF, gu.data() + e * kH * 2 * kF, gub.data() + e * 2 * kF,
                          d.data() + e * kF * kH, db.data() + e * kH, kH, kF);
  grads.push_back({"mlp.experts.gate_up_proj", gu});
  grads.push_back({"mlp.experts.gate_up_proj_bias", gub});
  grads.push_back({"mlp.experts.down_proj", d});
  grads.push_back({"mlp.experts.down_proj_bias", db});
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
    std::printf("gpt-oss mlp %s %s at %d ranks (ep %d): worst gradient %.3g of max|ref|, cosine %.6f\n",
                std::string(dispatch_kind_name(kind)).c_str(), std::string(precision_name(p)).c_str(), W, ep, worst,
                worst_cos);
}

TEST(MoeLayerGptOss, MatchesTransformersEveryDispatchBothPrecisions) {
  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep})
    for (Precision p : {Precision::f32, Precision::bf16}) run(kind, p);
}

// The packing is an exact inverse pair on the fixture's own experts (the loader's and the
// exporter's conversion).
TEST(MoeLayerGptOss, PackAndUnpackAreInverse) {
  const Vec packed = packed_experts("");
  const std::int64_t EF = gpt_oss_expert_floats(kH, kF);
  Vec gu(static_cast<std::size_t>(kH * 2 * kF)), gub(static_cast<std::size_t>(2 * kF));
  Vec d(static_cast<std::size_t>(kF * kH)), db(static_cast<std::size_t>(kH));
  const Vec want_gu = read("mlp.experts.gate_up_proj"), want_d = read("mlp.experts.down_proj");
  const Vec want_gub = read("mlp.experts.gate_up_proj_bias"), want_db = read("mlp.experts.down_proj_bias");
  for (std::int64_t e = 0; e < kE; ++e) {
    gpt_oss_unpack_expert(packed.data() + e * EF, gu.data(), gub.data(), d.data(), db.data(), kH, kF);
    EXPECT_TRUE(std::equal(gu.begin(), gu.end(), want_gu.begin() + e * kH * 2 * kF)) << e;
    EXPECT_TRUE(std::equal(gub.begin(), gub.end(), want_gub.begin() + e * 2 * kF)) << e;
    EXPECT_TRUE(std::equal(d.begin(), d.end(), want_d.begin() + e * kF * kH)) << e;
    EXPECT_TRUE(std::equal(db.begin(), db.end(), want_db.begin() + e * kH)) << e;
  }
  // Gate and up are taken apart: the first expert's gate row 0 is gate_up's even columns.
  EXPECT_EQ(packed[0], want_gu[0]);
  EXPECT_EQ(packed[1], want_gu[2 * kF]);
  EXPECT_EQ(packed[kF * kH], want_gu[1]);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
