// The FFN sublayer (layers/moe_layer.h) on one rank against a naive double reference
// of the whole sublayer (moe_layer_reference.h): post-attention RMSNorm, router
// (softmax, top-k, norm_topk_prob), routed SwiGLU experts, shared experts with and
// without Qwen2-MoE's sigmoid gate, the dense variant and the residual; y, dx, every
// parameter gradient and the router statistics added into the model's counts and
// prob_sums, with a random aux_grad so the aux-loss path of the router backward runs.
// The reference's backward is itself checked against central finite differences. Also:
// gradients add, statistics are added once per forward (not by backward's recompute),
// the Arena's measured per-phase peaks equal moe_layer_footprint, bad configs are refused.
#include "peakbound/layers/moe_layer.h"

#include <gtest/gtest.h>

#include <cstring>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/model/presets.h"
#include "tests/layers/layer_checks.h"
#include "tests/layers/moe_layer_harness.h"
#include "tests/layers/moe_layer_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using moe_ref::Params;
using moe_ref::rel_err;
using moe_ref::Vec;
using moe_test::Case;

constexpr double kTol = 1e-5;

// Device parameters (or zero gradients) of every expert, kept alive with their buffers.
struct DeviceParams {
  std::vector<Buffer> bufs;
  MoeLayerTensors t;
  DeviceParams(Device& dev, Component comp, const MoeLayerConfig& c, const Params& P, bool zero)
      : t(moe_test::tensors(dev, bufs, comp, c, P, zero)) {}
};

Buffer upload(Device& dev, const Vec& v) {
  Buffer b = dev.allocate(Component::workspace, v.size() * 4);
  for (std::size_t i = 0; i < v.size(); ++i) b.as<float>()[i] = static_cast<float>(v[i]);
  return b;
}

struct Worst {
  double fwd = 0, bwd = 0;
};

// Runs forward + backward of case c on one rank against the reference; returns the errors.
void run_case(const Case& c, Worst& worst) {
  SCOPED_TRACE(c.str());
  const MoeLayerConfig cfg = c.config();
  std::mt19937 rng(static_cast<std::uint32_t>(c.T * 7919 + c.K * 131 + c.norm * 17 + c.S * 5 + c.gate * 3 +
                                              c.dense + (c.hot + 1) * 1000));
  const Params P = moe_ref::random_params(cfg, rng, c.hot);
  const Vec x = moe_ref::randn(c.T * c.H, rng, c.hot >= 0 ? 1.0 : 0.0, c.hot >= 0 ? 0.2 : 1.0);
  const Vec dy = moe_ref::randn(c.T * c.H, rng, 0.0, 1.0);
  const Vec aux_grad = moe_ref::randn(c.E, rng, 0.0, 0.5);
  const Vec counts0 = moe_ref::randn(c.E, rng, 3.0, 0.0), sums0 = moe_ref::randn(c.E, rng, 0.5, 0.25);
  const moe_ref::Forward ref = moe_ref::forward(cfg, x, P);
  Vec ref_dx, gate_scale;
  Params ref_g;
  moe_ref::backward(cfg, x, P, dy, aux_grad, ref_dx, ref_g, &gate_scale);
  if (c.hot >= 0) {
    for (std::int64_t t = 0; t < c.T; ++t) ASSERT_EQ(ref.ids[t * c.K], c.hot) << "the hot expert is not first";
  }

  CpuDevice dev(64 << 20);
  SingleRankCommunicator one;
  DeviceParams dp(dev, Component::params, cfg, P, false), dg(dev, Component::grads, cfg, P, true);
  Buffer counts = upload(dev, counts0), sums = upload(dev, sums0), ag = upload(dev, aux_grad);
  MoeAuxState aux{counts.as<float>(), sums.as<float>(), ag.as<float>()};
  MoeLayer layer(dev, one, cfg, dp.t, dg.t, &aux);
  Buffer xb = upload(dev, x), dyb = upload(dev, dy);
  Buffer yb = dev.allocate(Component::workspace, x.size() * 4), dxb = dev.allocate(Component::workspace, x.size() * 4);
  const Shape s{c.T, c.H};
  layer.forward(xb.tensor(s, DType::f32), yb.tensor(s, DType::f32));
  // A recomputation (a checkpoint group's backward, forward_recompute): the same y bit for
  // bit, and no statistics (the checks at the end see them added once).
  Buffer y2 = dev.allocate(Component::workspace, x.size() * 4);
  layer.forward_recompute(xb.tensor(s, DType::f32), y2.tensor(s, DType::f32));
  layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
  dev.synchronize();
  if (!x.empty()) {
    EXPECT_EQ(std::memcmp(y2.data(), yb.data(), x.size() * 4), 0) << "forward_recompute's y";
  }

  const double ey = rel_err(yb.as<float>(), ref.y);
  EXPECT_LT(ey, kTol) << "y";
  worst.fwd = std::max(worst.fwd, ey);
  auto check = [&](const char* name, const Tensor& got, const Vec& want) {
    ASSERT_EQ(static_cast<std::size_t>(got.numel()), want.size()) << name;
    const double e = rel_err(got.data<float>(), want);
    EXPECT_LT(e, kTol) << name;
    worst.bwd = std::max(worst.bwd, e);
  };
  check("dx", dxb.tensor(s, DType::f32), ref_dx);
  check("d w_post", dg.t.w_post, ref_g.w_post);
  if (cfg.dense()) {
    check("d dense_gate", dg.t.dense_gate, ref_g.dense_gate);
    check("d dense_up", dg.t.dense_up, ref_g.dense_up);
    check("d dense_down", dg.t.dense_down, ref_g.dense_down);
    return;
  }
  check("d w_gate", dg.t.w_gate, ref_g.w_gate);
  check("d experts", dg.t.experts, ref_g.experts);
  if (c.S > 0) {
    check("d shared_gate", dg.t.shared_gate, ref_g.shared_gate);
    check("d shared_up", dg.t.shared_up, ref_g.shared_up);
    check("d shared_down", dg.t.shared_down, ref_g.shared_down);
  }
  if (c.gate) {
    // Relative to the magnitude of its terms (moe_ref::backward's gate_scale): with few
    // tokens it is a few dot products <dy, shared out>, which may cancel (T = 1 here
    // loses a factor ~300 to cancellation against max |ref|).
    double num = 0, den = 0;
    for (std::int64_t a = 0; a < c.H; ++a) {
      num = std::max(num, std::abs(double(dg.t.shared_expert_gate.data<float>()[a]) - ref_g.shared_expert_gate[a]));
      den = std::max(den, gate_scale[a]);
    }
    const double e = den > 0 ? num / den : num;
    EXPECT_LT(e, kTol) << "d shared_expert_gate";
    worst.bwd = std::max(worst.bwd, e);
  }
  // The statistics: added once (by forward; backward's recompute adds nothing).
  for (std::int64_t e = 0; e < c.E; ++e) {
    EXPECT_EQ(counts.as<float>()[e], static_cast<float>(counts0[e] + ref.counts[e])) << "counts " << e;
    EXPECT_NEAR(sums.as<float>()[e], sums0[e] + ref.prob_sums[e], 1e-5 * (1 + c.T)) << "prob_sums " << e;
  }
}

TEST(MoeLayer, MatchesTheDoubleReference) {
  Worst worst;
  int n = 0;
  for (std::int64_t T : {0, 1, 7, 33})
    for (std::int64_t K : {1, 2, 4})
      for (bool norm : {false, true})
        for (auto [S, Fs, gate] : {std::tuple<std::int64_t, std::int64_t, bool>{0, 0, false}, {2, 5, false},
                                   {1, 11, true}}) {
          Case c;
          c.T = T, c.K = K, c.norm = norm, c.S = S, c.Fs = Fs, c.gate = gate;
          run_case(c, worst);
          ++n;
        }
  std::printf("moe layer: worst relative error forward %.3g, backward %.3g over %d cases\n", worst.fwd, worst.bwd, n);
}

TEST(MoeLayer, EveryTokenToOneExpert) {
  Worst worst;
  for (std::int64_t K : {1, 2, 4})
    for (bool norm : {false, true}) {
      Case c;
      c.T = 33, c.K = K, c.norm = norm, c.hot = 5, c.S = 1, c.Fs = 7, c.gate = true;
      run_case(c, worst);
    }
  std::printf("moe layer, one hot expert: worst relative error forward %.3g, backward %.3g\n", worst.fwd, worst.bwd);
}

TEST(MoeLayer, DenseVariantMatchesTheDoubleReference) {
  Worst worst;
  for (std::int64_t T : {0, 1, 7, 33}) {
    Case c;
    c.T = T, c.dense = 14, c.E = 0, c.K = 0;
    run_case(c, worst);
  }
  std::printf("dense ffn layer: worst relative error forward %.3g, backward %.3g\n", worst.fwd, worst.bwd);
}

// The side SwiGLU over row tiles (tiles of 1, 5 and 16 rows on T = 1, 7, 33: tiles that
// do not divide T, a last tile of one row, one tile): the same results as the reference
// for the dense MLP, plain shared experts and the gated shared expert.
TEST(MoeLayer, SideFfnTilesMatchTheDoubleReference) {
  Worst worst;
  int n = 0;
  for (std::int64_t tile : {1, 5, 16})
    for (std::int64_t T : {1, 7, 33}) {
      Case d;
      d.T = T, d.dense = 14, d.E = 0, d.K = 0, d.tile = tile;
      run_case(d, worst);
      Case sh;
      sh.T = T, sh.S = 2, sh.Fs = 5, sh.tile = tile;
      run_case(sh, worst);
      Case g;
      g.T = T, g.S = 1, g.Fs = 11, g.gate = true, g.tile = tile;
      run_case(g, worst);
      n += 3;
    }
  std::printf("side ffn tiles: worst relative error forward %.3g, backward %.3g over %d cases\n", worst.fwd,
              worst.bwd, n);
}

// The whole sublayer over row tiles (MoeLayerConfig::seq_tile of 1, 5 and 16 rows on T = 7
// and 33, with side tiles of 3 inside some), for every variant and a hot expert: the same
// results as the reference; the statistics are added once per tile (the test's counts).
TEST(MoeLayer, RowTilesMatchTheDoubleReference) {
  Worst worst;
  int n = 0;
  for (std::int64_t seq_tile : {1, 5, 16})
    for (std::int64_t T : {7, 33})
      for (std::int64_t side : {kSideFfnTileRows, std::int64_t{3}}) {
        Case d;
        d.T = T, d.dense = 14, d.E = 0, d.K = 0, d.tile = side, d.seq_tile = seq_tile;
        Case q;
        q.T = T, q.K = 2, q.tile = side, q.seq_tile = seq_tile;
        Case sh;
        sh.T = T, sh.S = 2, sh.Fs = 5, sh.K = 4, sh.norm = false, sh.tile = side, sh.seq_tile = seq_tile;
        Case g;
        g.T = T, g.S = 1, g.Fs = 11, g.gate = true, g.K = 1, g.tile = side, g.seq_tile = seq_tile;
        Case hot = g;
        hot.hot = 5, hot.K = 2;
        for (const Case& c : {d, q, sh, g, hot}) {
          run_case(c, worst);
          ++n;
        }
      }
  std::printf("moe layer row tiles: worst relative error forward %.3g, backward %.3g over %d cases\n", worst.fwd,
              worst.bwd, n);
}

// The chain-rule reference against central differences of the double forward for
// L = sum(dy * y) + sum_{t,e} aux_grad[e] probs[t, e] (the aux loss's linearisation),
// on every element of x and of every parameter. Step 1e-5 in double.
TEST(MoeLayer, ReferenceBackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{5, 9, 4, 6, 3, true, 1, 5, true}, Case{4, 7, 3, 5, 2, false, 2, 3, false},
                        Case{3, 6, 0, 0, 0, true, 0, 0, false, 8}}) {
    SCOPED_TRACE(c.str());
    const MoeLayerConfig cfg = c.config();
    std::mt19937 rng(11);
    Params P = moe_ref::random_params(cfg, rng);
    Vec x = moe_ref::randn(c.T * c.H, rng, 0, 1);
    const Vec dy = moe_ref::randn(c.T * c.H, rng, 0, 1), aux_grad = moe_ref::randn(c.E, rng, 0, 0.5);
    Vec dx;
    Params G;
    moe_ref::backward(cfg, x, P, dy, cfg.dense() ? Vec{} : aux_grad, dx, G);
    auto loss = [&] {
      const moe_ref::Forward f = moe_ref::forward(cfg, x, P);
      double l = 0;
      for (std::size_t i = 0; i < f.y.size(); ++i) l += dy[i] * f.y[i];
      for (std::size_t i = 0; i < f.probs.size(); ++i) l += aux_grad[i % static_cast<std::size_t>(c.E)] * f.probs[i];
      return l;
    };
    auto fd_check = [&](const char* name, Vec& v, const Vec& grad) {
      double num = 0, den = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double h = 1e-5, keep = v[i];
        v[i] = keep + h;
        const double lp = loss();
        v[i] = keep - h;
        const double lm = loss();
        v[i] = keep;
        num = std::max(num, std::abs((lp - lm) / (2 * h) - grad[i]));
        den = std::max(den, std::abs(grad[i]));
      }
      EXPECT_LT(num / den, 1e-7) << name;
    };
    fd_check("x", x, dx);
    fd_check("w_post", P.w_post, G.w_post);
    if (cfg.dense()) {
      fd_check("dense_gate", P.dense_gate, G.dense_gate);
      fd_check("dense_up", P.dense_up, G.dense_up);
      fd_check("dense_down", P.dense_down, G.dense_down);
      continue;
    }
    fd_check("w_gate", P.w_gate, G.w_gate);
    fd_check("experts", P.experts, G.experts);
    fd_check("shared_gate", P.shared_gate, G.shared_gate);
    fd_check("shared_up", P.shared_up, G.shared_up);
    fd_check("shared_down", P.shared_down, G.shared_down);
    if (c.gate) fd_check("shared_expert_gate", P.shared_expert_gate, G.shared_expert_gate);
  }
}

// Backward adds into the gradients (a second call doubles them) and writes dx
// (bit-identical both times); zero_grad clears them; the HF names.
TEST(MoeLayer, BackwardAddsIntoGradientsAndWritesDx) {
  Case c;
  c.T = 9, c.K = 2, c.S = 1, c.Fs = 5, c.gate = true;
  const MoeLayerConfig cfg = c.config();
  std::mt19937 rng(5);
  const Params P = moe_ref::random_params(cfg, rng);
  CpuDevice dev(16 << 20);
  SingleRankCommunicator one;
  DeviceParams dp(dev, Component::params, cfg, P, false), dg(dev, Component::grads, cfg, P, true);
  MoeLayer layer(dev, one, cfg, dp.t, dg.t, nullptr);
  const Shape s{c.T, c.H};
  Buffer xb = upload(dev, moe_ref::randn(c.T * c.H, rng, 0, 1));
  Buffer dyb = upload(dev, moe_ref::randn(c.T * c.H, rng, 0, 1));
  Buffer dxb = dev.allocate(Component::workspace, static_cast<std::uint64_t>(c.T * c.H) * 4);
  auto run = [&] {
    layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
    dev.synchronize();
  };
  run();
  const std::vector<Parameter> params = layer.parameters();
  ASSERT_EQ(params.size(), 2u + 3u * 8u + 3u + 1u);
  EXPECT_EQ(params[0].name, "post_attention_layernorm.weight");
  EXPECT_EQ(params[1].name, "mlp.gate.weight");
  EXPECT_EQ(params[2].name, "mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(params[25].name, "mlp.experts.7.down_proj.weight");
  EXPECT_EQ(params[26].name, "mlp.shared_expert.gate_proj.weight");
  EXPECT_EQ(params.back().name, "mlp.shared_expert_gate.weight");
  // The per-expert views cover the flat buffer in order.
  EXPECT_EQ(params[25].value.data<float>() + c.H * c.F, dp.t.experts.data<float>() + dp.t.experts.numel());
  layer_test::expect_backward_adds_into_grads(layer, dev, run, dxb.tensor(s, DType::f32));
}

// Measured Arena peaks of one forward and one backward call equal the footprint for
// Component::layer; nothing under layer outlives a call.
TEST(MoeLayer, MeasuredPeaksPerPhaseEqualTheFootprint) {
  std::vector<Case> cases;
  for (std::int64_t T : {0, 1, 37}) {
    Case a;
    a.T = T;
    cases.push_back(a);  // Qwen3 / Mixtral: no shared experts
    Case b = a;
    b.S = 2, b.Fs = 5, b.K = 4;
    cases.push_back(b);
    Case g = a;
    g.S = 1, g.Fs = 9, g.gate = true, g.K = 1;
    cases.push_back(g);
    Case d = a;
    d.dense = 13;
    cases.push_back(d);
    Case dt = d;  // tiled: [5, F] intermediates, whatever T
    dt.tile = 5;
    cases.push_back(dt);
    Case gt = g;
    gt.tile = 5;
    cases.push_back(gt);
    // The whole sublayer over row tiles: every buffer one tile's, whatever T.
    for (Case c : {a, b, g, d}) {
      c.seq_tile = 6;
      cases.push_back(c);
    }
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    const MoeLayerConfig cfg = c.config();
    CpuDevice dev(64 << 20);
    SingleRankCommunicator one;
    std::mt19937 rng(3);
    const Params P = moe_ref::random_params(cfg, rng);
    DeviceParams dp(dev, Component::params, cfg, P, false), dg(dev, Component::grads, cfg, P, true);
    MoeLayer layer(dev, one, cfg, dp.t, dg.t, nullptr);
    const Vec xv = moe_ref::randn(c.T * c.H, rng, 0, 1);
    Buffer x = upload(dev, xv), dy = upload(dev, xv);
    Buffer y = dev.allocate(Component::workspace, xv.size() * 4);
    Buffer dx = dev.allocate(Component::workspace, xv.size() * 4);
    const Footprint f = moe_layer_footprint(c.T, cfg, 4);
    const Shape s{c.T, c.H};
    auto check = [&](const char* phase) {
      EXPECT_EQ(dev.arena().peak(Component::layer), f.phase(phase).device[static_cast<std::size_t>(Component::layer)])
          << phase;
      EXPECT_EQ(dev.arena().live(Component::layer), 0u);
      EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
    };
    dev.arena().reset_peaks();
    layer.forward(x.tensor(s, DType::f32), y.tensor(s, DType::f32));
    check("forward");
    dev.arena().reset_peaks();
    layer.backward(x.tensor(s, DType::f32), dy.tensor(s, DType::f32), dx.tensor(s, DType::f32));
    check("backward");
    dev.synchronize();
    if (c.T > 0) {
      EXPECT_GT(f.phase("backward").device_total(), f.phase("forward").device_total());
    }
  }
}

TEST(MoeLayer, RejectsBadConfigAndParameterShapes) {
  Case c;
  c.T = 3, c.S = 1, c.Fs = 4, c.gate = true;
  MoeLayerConfig cfg = c.config();
  MoeLayerConfig bad = cfg;
  bad.scoring = RouterScoring::sigmoid;
  bad.n_group = 3;  // does not divide the 8 experts
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.score_correction = true;  // a correction bias needs sigmoid scoring
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.top_k = 9;
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.shared_experts = 0;  // a gate without shared experts
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.shared_ffn = 0;
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.experts = 0;
  EXPECT_THROW(check_moe_layer_config(bad), InvalidArgument);
  bad = cfg;
  bad.experts = 0, bad.top_k = 0, bad.dense_ffn = 8;  // dense: MoE fields ignored
  EXPECT_NO_THROW(check_moe_layer_config(bad));

  CpuDevice dev(16 << 20);
  SingleRankCommunicator one;
  std::mt19937 rng(1);
  const Params P = moe_ref::random_params(cfg, rng);
  DeviceParams dp(dev, Component::params, cfg, P, false), dg(dev, Component::grads, cfg, P, true);
  bad = cfg;
  bad.scoring = RouterScoring::sigmoid;
  bad.n_group = 3;
  EXPECT_THROW(MoeLayer(dev, one, bad, dp.t, dg.t, nullptr), InvalidArgument);
  bad.n_group = 1;
  bad.score_correction = true;  // and no correction tensor given
  EXPECT_THROW(MoeLayer(dev, one, bad, dp.t, dg.t, nullptr), InvalidArgument);
  MoeLayerTensors t = dp.t;
  t.experts = Tensor(t.experts.raw(), Shape{7, 3 * c.F * c.H}, DType::f32, Location::device);  // one expert short
  EXPECT_THROW(MoeLayer(dev, one, cfg, t, dg.t, nullptr), InvalidArgument);
  t = dg.t;
  t.shared_expert_gate = Tensor();
  EXPECT_THROW(MoeLayer(dev, one, cfg, dp.t, t, nullptr), InvalidArgument);
  t = dp.t;
  t.w_gate = t.w_gate.view(Shape{c.H, c.E});
  EXPECT_THROW(MoeLayer(dev, one, cfg, t, dg.t, nullptr), InvalidArgument);
  EXPECT_NO_THROW(MoeLayer(dev, one, cfg, dp.t, dg.t, nullptr));
}

// The sublayer config from a model: Qwen3-MoE, Mixtral (all MoE), DeepSeek-V3 (leading
// dense layers; sigmoid scoring and score correction refused), gpt-oss (biases refused).
TEST(MoeLayer, ConfigFromTheModel) {
  const ModelConfig q = preset_config("qwen3-30b-a3b");
  const MoeLayerConfig c = moe_layer_config(q, 0, 1e-6f, DispatchKind::llep, DispatchOptions{});
  EXPECT_FALSE(c.dense());
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.ffn, 768);
  EXPECT_EQ(c.experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_experts, 0);
  EXPECT_EQ(c.kind, DispatchKind::llep);
  const MoeShape sh = moe_layer_dispatch_shape(c);
  EXPECT_EQ(sh.expert_floats(), 3 * 768 * 2048);
  const ModelConfig mx = preset_config("mixtral-8x22b");
  EXPECT_EQ(moe_layer_config(mx, 3, 1e-5f, DispatchKind::standard_ep, {}).experts, 8);
  EXPECT_THROW(moe_layer_config(mx, mx.num_layers, 1e-5f, DispatchKind::standard_ep, {}), InvalidArgument);

  ModelConfig ds = preset_config("deepseek-v3");
  ASSERT_GT(ds.num_dense_layers, 0);
  const MoeLayerConfig d0 = moe_layer_config(ds, 0, 1e-6f, DispatchKind::standard_ep, {});
  EXPECT_TRUE(d0.dense());
  EXPECT_EQ(d0.dense_ffn, ds.dense_intermediate_size);
  // DeepSeek-V3's router: sigmoid, 8 groups keeping 4, times 2.5, the correction bias.
  const MoeLayerConfig ds3 = moe_layer_config(ds, ds.num_dense_layers, 1e-6f, DispatchKind::standard_ep, {});
  EXPECT_EQ(ds3.scoring, RouterScoring::sigmoid);
  EXPECT_EQ(ds3.n_group, 8);
  EXPECT_EQ(ds3.topk_group, 4);
  EXPECT_FLOAT_EQ(ds3.routed_scaling, 2.5f);
  EXPECT_TRUE(ds3.score_correction);
  ds.router_scoring = RouterScoring::softmax;  // grouping and a scale with softmax: refused
  EXPECT_THROW(moe_layer_config(ds, ds.num_dense_layers, 1e-6f, DispatchKind::standard_ep, {}), InvalidArgument);
  ds.router_score_correction = false;
  ds.n_group = ds.topk_group = 1;
  ds.routed_scaling_factor = 1.0;
  const MoeLayerConfig d3 = moe_layer_config(ds, ds.num_dense_layers, 1e-6f, DispatchKind::standard_ep, {});
  EXPECT_EQ(d3.shared_experts, ds.num_shared_experts);
  EXPECT_EQ(d3.side_ffn(), ds.num_shared_experts * ds.moe_intermediate_size);
  EXPECT_FALSE(d3.shared_gate);
  EXPECT_THROW(moe_layer_dispatch_shape(d0), InvalidArgument);

  // gpt-oss: the router's and the experts' biases, the clamped SwiGLU, packed rows of
  // 3FH + 2F + H; a dense MLP with biases is still refused.
  ModelConfig oss = preset_config("gpt-oss-120b");
  const MoeLayerConfig g = moe_layer_config(oss, 0, 1e-5f, DispatchKind::standard_ep, {});
  EXPECT_TRUE(g.router_bias && g.expert_bias && g.clamped);
  EXPECT_FLOAT_EQ(g.clamp.limit, 7.0f);
  EXPECT_FLOAT_EQ(g.clamp.alpha, 1.702f);
  EXPECT_EQ(moe_layer_dispatch_shape(g).expert_floats(), 3 * 2880 * 2880 + 2 * 2880 + 2880);
  oss.num_experts = 0;
  oss.dense_intermediate_size = 64;
  EXPECT_THROW(moe_layer_config(oss, 0, 1e-5f, DispatchKind::standard_ep, {}), InvalidArgument);  // mlp_bias
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
