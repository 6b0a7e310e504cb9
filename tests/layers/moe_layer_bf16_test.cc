// The FFN sublayer in bf16 (layers/moe_layer.h, MoeLayerConfig::precision) against the
// f32 layer on the same values: parameters, x, dy and aux_grad are drawn, rounded to
// bf16, and the f32 layer runs on their widened copies, so both see exactly the same
// inputs and differ only by bf16's roundings inside the layer. Each stored activation (h,
// the router's d_logits16, the experts' and the side SwiGLU's gate/up/act, shared_out,
// dh, y, dx) rounds by up to 2^-9 relative and a path chains a few of them (dx: the
// dispatch's dh, + router, + side FFN, each rounded once, then RMSNorm's backward), so y
// and dx stay within 1e-2 of max|ref| (norm-wise) and every fp32 parameter gradient (an
// fp32 sum of products of rounded factors) keeps cosine >= 0.999 with the f32 one. The
// router's top-k must choose the same experts in both: each case draws until every
// token's margin (moe_ref::topk_margin) is at least kMargin, ten times the ~1e-3 the
// logits differ by, so a flip is not what a failure measures. Variants: dense, MoE
// (Qwen3), shared experts (DeepSeek), the gated shared expert (Qwen2-MoE), every token
// to one expert; T = 0, 1, 37 and 260 (past nn/linear's 256-row tile), H = 20 and F = 6,
// 13 (not multiples of 8), side tiles of 5 rows. Also: the Arena's measured peaks equal
// moe_layer_footprint in bf16 (and the bf16-only specs are 0 bytes under f32), gradients
// are added into, and a layer refuses tensors of the other precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/moe_layer.h"
#include "tests/layers/moe_layer_harness.h"
#include "tests/layers/moe_layer_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using moe_ref::Params;
using moe_ref::Vec;
using moe_test::Case;
using moe_test::host;
using moe_test::put;
using moe_test::tensors;

constexpr double kTol = 1e-2;     // y, dx: max|bf16 - f32| / max|f32|
constexpr double kCosine = 0.999;  // every parameter gradient
constexpr double kMargin = 0.015;  // the router's top-k margin in logits (see the top)

struct Result {
  std::vector<float> y, dx, counts, sums;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;  // parameters() order
};

// One forward and one backward in precision p; checks the measured per-phase peaks
// against moe_layer_footprint(T, cfg) (the layer's precision).
// in_place: the forward runs on a copy of x as y = x's buffer (MoeLayer::forward_in_place).
// rows: the backward takes x by rows (MoeLayer::backward_rows; footprint phase "backward
// rows"), each row asked for exactly once.
Result run(const Case& c, Precision p, const Params& P, const Vec& x, const Vec& dy, const Vec& aux_grad,
           bool in_place = false, bool rows = false) {
  const MoeLayerConfig cfg = c.config(p);
  const DType a = activation_dtype(p);
  CpuDevice dev(256 << 20);
  SingleRankCommunicator one;
  std::vector<Buffer> keep;
  const MoeLayerTensors pt = tensors(dev, keep, Component::params, cfg, P, false, param_dtype(p));
  const MoeLayerTensors gt = tensors(dev, keep, Component::grads, cfg, P, true, DType::f32);
  const Vec zeros(static_cast<std::size_t>(c.E), 0.0);
  const Shape e{std::max<std::int64_t>(c.E, 1)};
  const Tensor counts = put(dev, keep, Component::workspace, e, c.E > 0 ? &zeros : nullptr, DType::f32);
  const Tensor sums = put(dev, keep, Component::workspace, e, c.E > 0 ? &zeros : nullptr, DType::f32);
  const Tensor ag = put(dev, keep, Component::workspace, e, c.E > 0 ? &aux_grad : nullptr, DType::f32);
  MoeAuxState aux{counts.data<float>(), sums.data<float>(), ag.data<float>()};
  MoeLayer layer(dev, one, cfg, pt, gt, c.dense > 0 ? nullptr : &aux);
  const Shape s{c.T, c.H};
  const Tensor xt = put(dev, keep, Component::workspace, s, &x, a);
  const Tensor dyt = put(dev, keep, Component::workspace, s, &dy, a);
  const Tensor yt = put(dev, keep, Component::workspace, s, in_place ? &x : nullptr, a);
  const Tensor dxt = put(dev, keep, Component::workspace, s, nullptr, a);
  const Footprint f = moe_layer_footprint(c.T, cfg);
  auto check = [&](const char* phase) {
    EXPECT_EQ(dev.arena().peak(Component::layer), f.phase(phase).device[static_cast<std::size_t>(Component::layer)])
        << phase << " " << precision_name(p);
    EXPECT_EQ(dev.arena().live(Component::layer), 0u);
  };
  dev.arena().reset_peaks();
  layer.forward(in_place ? yt : xt, yt);
  check("forward");
  dev.arena().reset_peaks();
  if (rows) {
    std::vector<int> asked(static_cast<std::size_t>(c.T), 0);
    const std::size_t row_bytes = static_cast<std::size_t>(c.H) * dtype_size(a);
    const Block::RowSource src{c.T, c.H, a, [&](std::int64_t first, std::int64_t n, void* dst) {
                                 for (std::int64_t r = first; r < first + n; ++r) ++asked[static_cast<std::size_t>(r)];
                                 std::memcpy(dst, static_cast<const char*>(xt.raw()) + first * row_bytes,
                                             static_cast<std::size_t>(n) * row_bytes);
                               }};
    layer.backward_rows(src, dyt, dxt);
    check("backward rows");
    EXPECT_EQ(asked, std::vector<int>(static_cast<std::size_t>(c.T), 1));
  } else {
    layer.backward(xt, dyt, dxt);
    check("backward");
  }
  dev.synchronize();
  Result r;
  r.y = host(yt);
  r.dx = host(dxt);
  if (c.E > 0) r.counts = host(counts), r.sums = host(sums);
  for (const Parameter& q : layer.parameters()) {
    r.names.push_back(q.name);
    r.grads.push_back(host(q.grad));
  }
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - ref[i]));
    den = std::max(den, std::abs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

struct Worst {
  double y = 0, dx = 0, cos = 1;
  std::string cos_name;
};

// Draws the case's values (rounded to bf16), each token's x row redrawn until its router
// margin holds, then runs both precisions and compares.
void compare(const Case& c, Worst& w) {
  SCOPED_TRACE(c.str());
  const MoeLayerConfig cfg = c.config(Precision::f32);
  std::mt19937 rng(static_cast<std::uint32_t>(c.T * 7919 + c.K * 131 + c.S * 5 + c.gate * 3 + c.dense + c.hot));
  Params P = moe_ref::random_params(cfg, rng, c.hot);
  moe_ref::round_to_bf16(P);
  Vec x;
  for (std::int64_t t = 0; t < c.T; ++t) {
    Vec row;
    double margin = 0;
    for (int tries = 0; tries < 1000 && !(margin >= kMargin); ++tries) {
      row = moe_ref::randn(c.H, rng, c.hot >= 0 ? 1.0 : 0.0, c.hot >= 0 ? 0.2 : 1.0);
      moe_ref::round_to_bf16(row);
      margin = cfg.dense() ? INFINITY : moe_ref::topk_margin(moe_ref::forward(cfg, row, P), 1, c.E, c.K);
    }
    ASSERT_GE(margin, kMargin) << "no x row of token " << t << " gave a router margin of " << kMargin;
    x.insert(x.end(), row.begin(), row.end());
  }
  Vec dy = moe_ref::randn(c.T * c.H, rng, 0, 1), aux_grad = moe_ref::randn(c.E, rng, 0, 0.5);
  moe_ref::round_to_bf16(dy);
  moe_ref::round_to_bf16(aux_grad);
  const Result r32 = run(c, Precision::f32, P, x, dy, aux_grad);
  const Result r16 = run(c, Precision::bf16, P, x, dy, aux_grad);
  if (c.T == 0) return;
  const double ey = rel(r16.y, r32.y), edx = rel(r16.dx, r32.dx);
  EXPECT_LE(ey, kTol) << "y";
  EXPECT_LE(edx, kTol) << "dx";
  w.y = std::max(w.y, ey);
  w.dx = std::max(w.dx, edx);
  ASSERT_EQ(r16.names, r32.names);
  for (std::size_t k = 0; k < r32.grads.size(); ++k) {
    const double cs = moe_ref::cosine(r16.grads[k], r32.grads[k]);
    EXPECT_GE(cs, kCosine) << "d " << r32.names[k];
    if (cs < w.cos) w.cos = cs, w.cos_name = r32.names[k];
  }
  // The same experts chosen: the same counts; the fp32 probability sums of bf16 logits.
  EXPECT_EQ(r16.counts, r32.counts);
  if (!r32.sums.empty()) {
    EXPECT_LE(rel(r16.sums, r32.sums), kTol) << "prob_sums";
  }
}

std::vector<Case> variants(std::int64_t T) {
  Case d;  // dense (a leading dense layer)
  d.T = T, d.dense = 14, d.E = 0, d.K = 0;
  Case m;  // Qwen3-MoE / Mixtral
  m.T = T, m.F = 13;
  Case sh;  // DeepSeek: two shared experts
  sh.T = T, sh.S = 2, sh.Fs = 5, sh.K = 4, sh.norm = false;
  Case g;  // Qwen2-MoE: one gated shared expert
  g.T = T, g.S = 1, g.Fs = 11, g.gate = true, g.K = 1;
  return {d, m, sh, g};
}

TEST(MoeLayerBf16, MatchesTheF32LayerOnWidenedInputs) {
  Worst w;
  int n = 0;
  for (std::int64_t T : {0, 1, 37, 260})
    for (const Case& c : variants(T)) {
      compare(c, w);
      ++n;
    }
  std::printf("moe layer bf16 vs f32: worst y %.3g, dx %.3g of max|ref|, lowest gradient cosine %.6f (%s), %d cases\n",
              w.y, w.dx, w.cos, w.cos_name.c_str(), n);
}

// Side SwiGLU row tiles of 5 (not dividing T), and every token's first choice one expert
// (the dispatch's hot skew: one expert takes all T rows).
TEST(MoeLayerBf16, SideTilesAndOneHotExpert) {
  Worst w;
  for (const Case& base : variants(37)) {
    Case c = base;
    c.tile = 5;
    compare(c, w);
  }
  for (std::int64_t K : {1, 2}) {
    Case h;
    h.T = 37, h.K = K, h.hot = 5, h.S = 1, h.Fs = 7, h.gate = true;
    compare(h, w);
  }
  std::printf("moe layer bf16 vs f32, tiles and a hot expert: worst y %.3g, dx %.3g, lowest cosine %.6f (%s)\n", w.y,
              w.dx, w.cos, w.cos_name.c_str());
}

// The whole sublayer over row tiles of 6 (MoeLayerConfig::seq_tile; side tiles of 4 inside
// them too): bf16 against f32 as untiled, each precision's peaks one tile's footprint.
TEST(MoeLayerBf16, RowTiles) {
  Worst w;
  for (const Case& base : variants(37))
    for (std::int64_t side : {kSideFfnTileRows, std::int64_t{4}}) {
      Case c = base;
      c.seq_tile = 6;
      c.tile = side;
      compare(c, w);
    }
  std::printf("moe layer bf16 vs f32, row tiles: worst y %.3g, dx %.3g, lowest cosine %.6f (%s)\n", w.y, w.dx, w.cos,
              w.cos_name.c_str());
}

// The forward in place (y over x: a decoder layer runs its MLP on the attention's output
// that way) gives the bits of the forward into a separate y, in both precisions, for every
// variant, tiled and not, with empty and one-token calls; the backward after it too. So
// does the backward with its input by rows (a decoder layer's, fed the attention's output
// a row tile at a time), whose peak is one tile's input more than the backward's (phase
// "backward rows").
TEST(MoeLayerBf16, ForwardInPlaceIsBitwiseTheSame) {
  int n = 0;
  for (std::int64_t T : {0, 1, 37})
    for (const Case& base : variants(T))
      for (std::int64_t seq_tile : {0, 6})
        for (std::int64_t hot : {-1, 3}) {
          Case c = base;
          c.seq_tile = seq_tile;
          if (hot >= 0 && c.E == 0) continue;
          c.hot = hot;  // every token's first choice one expert
          SCOPED_TRACE(c.str());
          const MoeLayerConfig cfg = c.config(Precision::f32);
          std::mt19937 rng(static_cast<std::uint32_t>(T * 31 + seq_tile + c.S * 7 + c.dense + hot * 3 + 100));
          Params P = moe_ref::random_params(cfg, rng, c.hot);
          Vec x = moe_ref::randn(c.T * c.H, rng, hot >= 0 ? 1.0 : 0.0, hot >= 0 ? 0.2 : 1.0);
          Vec dy = moe_ref::randn(c.T * c.H, rng, 0, 1), aux_grad = moe_ref::randn(c.E, rng, 0, 0.5);
          for (Precision p : {Precision::f32, Precision::bf16}) {
            const Result apart = run(c, p, P, x, dy, aux_grad, false);
            const Result over = run(c, p, P, x, dy, aux_grad, true);
            EXPECT_EQ(over.y, apart.y) << precision_name(p);
            EXPECT_EQ(over.dx, apart.dx) << precision_name(p);
            EXPECT_EQ(over.grads, apart.grads) << precision_name(p);
            EXPECT_EQ(over.counts, apart.counts) << precision_name(p);
            EXPECT_EQ(over.sums, apart.sums) << precision_name(p);
            const Result by_rows = run(c, p, P, x, dy, aux_grad, false, /*rows=*/true);
            EXPECT_EQ(by_rows.dx, apart.dx) << precision_name(p);
            EXPECT_EQ(by_rows.grads, apart.grads) << precision_name(p);
            EXPECT_EQ(by_rows.counts, apart.counts) << precision_name(p);
            EXPECT_EQ(by_rows.sums, apart.sums) << precision_name(p);
            const Footprint f = moe_layer_footprint(c.T, c.config(p));
            EXPECT_EQ(f.phase("backward rows").device_total(),
                      f.phase("backward").device_total() + moe_layer_buffers(c.T, c.config(p)).x_rows.reserved());
            ++n;
          }
        }
  EXPECT_GT(n, 40);
}

// Under f32 the bf16-only specs are 0 bytes (so the f32 footprint is the old one); under
// bf16 they are sized and the activations are half.
TEST(MoeLayerBf16, BuffersFollowThePrecision) {
  Case g;
  g.T = 300, g.S = 1, g.Fs = 11, g.gate = true;
  const MoeLayerBuffers f = moe_layer_buffers(g.T, g.config(Precision::f32));
  EXPECT_EQ(f.router.d_logits16.bytes, 0u);
  EXPECT_EQ(f.gate_dz.bytes, 0u);
  EXPECT_EQ(f.tile.bytes, 0u);
  EXPECT_EQ(f.h.bytes, 300u * 20 * 4);
  const MoeLayerBuffers b = moe_layer_buffers(g.T, g.config(Precision::bf16));
  EXPECT_EQ(b.router.d_logits16.bytes, 300u * 8 * 2);
  EXPECT_EQ(b.gate_dz.bytes, 300u * 2);
  EXPECT_EQ(b.tile.bytes, 256u * 20 * 4);  // [min(T, 256), max(H, Fs)]
  EXPECT_EQ(b.h.bytes, 300u * 20 * 2);
  EXPECT_EQ(b.dh.bytes, b.h.bytes);
  EXPECT_EQ(b.rstd.bytes, f.rstd.bytes);
  EXPECT_EQ(b.router.probs.bytes, f.router.probs.bytes);
  EXPECT_EQ(b.gate_logit.bytes, f.gate_logit.bytes);
  // The f32 footprint through the config equals the elem_bytes = 4 form.
  const MoeLayerConfig c32 = g.config(Precision::f32);
  for (const char* phase : {"forward", "backward"})
    EXPECT_EQ(moe_layer_footprint(g.T, c32).phase(phase).device_total(),
              moe_layer_footprint(g.T, c32, 4).phase(phase).device_total());
}

// A second backward adds the same fp32 gradients again and writes the same dx; the
// parameters() views address the bf16 expert buffer by element; a RowSource of another
// shape or dtype, or without a fill, is refused.
TEST(MoeLayerBf16, BackwardAddsIntoGradientsAndWritesDx) {
  Case c;
  c.T = 9, c.S = 1, c.Fs = 5, c.gate = true;
  const MoeLayerConfig cfg = c.config(Precision::bf16);
  std::mt19937 rng(5);
  Params P = moe_ref::random_params(cfg, rng);
  CpuDevice dev(16 << 20);
  SingleRankCommunicator one;
  std::vector<Buffer> keep;
  const MoeLayerTensors pt = tensors(dev, keep, Component::params, cfg, P, false, DType::bf16);
  const MoeLayerTensors gt = tensors(dev, keep, Component::grads, cfg, P, true, DType::f32);
  MoeLayer layer(dev, one, cfg, pt, gt, nullptr);
  const Shape s{c.T, c.H};
  const Vec xv = moe_ref::randn(c.T * c.H, rng, 0, 1), dyv = moe_ref::randn(c.T * c.H, rng, 0, 1);
  const Tensor x = put(dev, keep, Component::workspace, s, &xv, DType::bf16);
  const Tensor dy = put(dev, keep, Component::workspace, s, &dyv, DType::bf16);
  const Tensor dx = put(dev, keep, Component::workspace, s, nullptr, DType::bf16);
  layer.backward(x, dy, dx);
  dev.synchronize();
  const std::vector<Parameter> params = layer.parameters();
  ASSERT_EQ(params.size(), 2u + 3u * 8u + 3u + 1u);
  EXPECT_EQ(params[25].name, "mlp.experts.7.down_proj.weight");
  EXPECT_EQ(params[25].value.dtype(), DType::bf16);
  EXPECT_EQ(params[25].grad.dtype(), DType::f32);
  EXPECT_EQ(params[25].value.data<bf16>() + c.H * c.F, pt.experts.data<bf16>() + pt.experts.numel());
  EXPECT_EQ(params[25].grad.data<float>() + c.H * c.F, gt.experts.data<float>() + gt.experts.numel());
  const auto backward = [&] {
    layer.backward(x, dy, dx);
    dev.synchronize();
  };
  layer_test::expect_backward_adds_into_grads(layer, dev, backward, dx);
  // A RowSource that does not match the layer is refused in one line.
  const auto fill = [](std::int64_t, std::int64_t, void*) {};
  for (const Block::RowSource& src : {Block::RowSource{c.T, c.H + 1, DType::bf16, fill},
                                      Block::RowSource{c.T, c.H, DType::f32, fill},
                                      Block::RowSource{c.T, c.H, DType::bf16, nullptr}})
    EXPECT_THROW(layer.backward_rows(src, dy, dx), InvalidArgument);
}

TEST(MoeLayerBf16, RefusesTensorsOfTheOtherPrecision) {
  Case c;
  c.T = 3, c.S = 1, c.Fs = 4, c.gate = true;
  const MoeLayerConfig c16 = c.config(Precision::bf16), c32 = c.config(Precision::f32);
  std::mt19937 rng(1);
  const Params P = moe_ref::random_params(c16, rng);
  CpuDevice dev(16 << 20);
  SingleRankCommunicator one;
  std::vector<Buffer> keep;
  const MoeLayerTensors p16 = tensors(dev, keep, Component::params, c16, P, false, DType::bf16);
  const MoeLayerTensors p32 = tensors(dev, keep, Component::params, c16, P, false, DType::f32);
  const MoeLayerTensors g32 = tensors(dev, keep, Component::grads, c16, P, true, DType::f32);
  EXPECT_THROW(MoeLayer(dev, one, c16, p32, g32, nullptr), InvalidArgument);  // f32 parameters
  EXPECT_THROW(MoeLayer(dev, one, c16, p16, p16, nullptr), InvalidArgument);  // bf16 gradients
  EXPECT_THROW(MoeLayer(dev, one, c32, p16, g32, nullptr), InvalidArgument);
  MoeLayer layer(dev, one, c16, p16, g32, nullptr);
  const Shape s{c.T, c.H};
  const Tensor x = put(dev, keep, Component::workspace, s, nullptr, DType::f32);
  const Tensor y = put(dev, keep, Component::workspace, s, nullptr, DType::f32);
  EXPECT_ANY_THROW(layer.forward(x, y));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
