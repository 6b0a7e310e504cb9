// The MoE FFN sublayer (layers/moe_layer.h) over an expert-parallel group = the world
// (1 rank without mpirun; 2, 3, 4 under mpirun), each rank with a different token count
// and rank 1 with none, for every dispatch kind (standard_ep, llep, pipelined_llep with
// small knobs so that LLEP spills and the pipeline takes several rounds): every rank
// computes the double reference of the whole sublayer on ALL ranks' tokens and compares
// its own rows of y and dx, its own experts' gradients, and the world sums of the
// replicated parameters' gradients and of the router statistics; and the layer's
// measured peak against moe_layer_footprint at each rank's token count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/moe_layer.h"
#include "tests/comm/world.h"
#include "tests/layers/moe_layer_harness.h"
#include "tests/layers/moe_layer_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using moe_ref::Params;
using moe_ref::rel_err;
using moe_ref::Vec;
using moe_test::host;
using moe_test::put;
using testing::world;

constexpr double kTol = 1e-5;

// Rank r's tokens: rank 1 has none, the others differ.
std::int64_t tokens_of(int r) { return r == 1 ? 0 : 9 + 7 * r; }

Buffer upload(Device& dev, const double* v, std::size_t n) {
  Buffer b = dev.allocate(Component::workspace, n * 4);
  for (std::size_t i = 0; i < n; ++i) b.as<float>()[i] = static_cast<float>(v[i]);
  return b;
}

// Rank `rank` of ep's tensors: every parameter, its slice of E / ep experts.
MoeLayerTensors tensors(Device& dev, std::vector<Buffer>& keep, Component comp, const MoeLayerConfig& c,
                        const Params& P, bool zero, int rank, int ep, DType dt = DType::f32) {
  const std::int64_t local = c.experts / ep;
  return moe_test::tensors(dev, keep, comp, c, P, zero, dt, rank * local, local);
}

// World sum of a device tensor, in place on a host copy.
std::vector<float> world_sum(const Tensor& t) {
  std::vector<float> v(t.data<float>(), t.data<float>() + t.numel());
  world().all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
  return v;
}

// expect_spill: LLEP must spill here (with more than one rank), so the test covers lent experts.
// seq_tile > 0: the layer over row tiles of that many tokens (ranks hold 0-5 tiles of
// their own, and every rank runs the group's most).
void expect_exact(const MoeLayerConfig& base, int hot, const char* what, bool expect_spill = false,
                  std::int64_t seq_tile = 0) {
  Communicator& g = world();
  const int ep = g.size(), rank = g.rank();
  std::vector<std::int64_t> T(static_cast<std::size_t>(ep));
  for (int r = 0; r < ep; ++r) T[static_cast<std::size_t>(r)] = tokens_of(r);
  const std::int64_t N = std::accumulate(T.begin(), T.end(), std::int64_t{0});
  std::int64_t off = 0;
  for (int r = 0; r < rank; ++r) off += T[static_cast<std::size_t>(r)];
  const std::int64_t Tr = T[static_cast<std::size_t>(rank)], H = base.hidden, E = base.experts;

  // The same problem on every rank (same seed), the reference over all N tokens.
  std::mt19937 rng(17);
  const Params P = moe_ref::random_params(base, rng, hot);
  const Vec x = moe_ref::randn(N * H, rng, hot >= 0 ? 1.0 : 0.0, hot >= 0 ? 0.2 : 1.0);
  const Vec dy = moe_ref::randn(N * H, rng, 0, 1), aux_grad = moe_ref::randn(E, rng, 0, 0.5);
  const moe_ref::Forward ref = moe_ref::forward(base, x, P);
  Vec ref_dx;
  Params ref_g;
  moe_ref::backward(base, x, P, dy, aux_grad, ref_dx, ref_g);

  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
    SCOPED_TRACE(std::string(what) + " " + std::string(dispatch_kind_name(kind)) + " EP=" + std::to_string(ep) +
                 " rank=" + std::to_string(rank) + " tile=" + std::to_string(seq_tile));
    MoeLayerConfig cfg = base;
    cfg.kind = kind;
    cfg.seq_tile = seq_tile;
    cfg.dispatch.min_spill = 4;
    cfg.dispatch.cap = 7;
    CpuDevice dev(128ull << 20);
    std::vector<Buffer> keep;
    const MoeLayerTensors pt = tensors(dev, keep, Component::params, cfg, P, false, rank, ep);
    const MoeLayerTensors gt = tensors(dev, keep, Component::grads, cfg, P, true, rank, ep);
    const Vec zeros(static_cast<std::size_t>(E), 0.0);
    Buffer counts = upload(dev, zeros.data(), zeros.size()), sums = upload(dev, zeros.data(), zeros.size());
    Buffer ag = upload(dev, aux_grad.data(), aux_grad.size());
    MoeAuxState aux{counts.as<float>(), sums.as<float>(), ag.as<float>()};
    MoeLayer layer(dev, g, cfg, pt, gt, &aux);
    const auto n = static_cast<std::size_t>(Tr * H);
    Buffer xb = upload(dev, x.data() + off * H, n), dyb = upload(dev, dy.data() + off * H, n);
    Buffer yb = dev.allocate(Component::workspace, n * 4), dxb = dev.allocate(Component::workspace, n * 4);
    const Shape s{Tr, H};
    layer.forward(xb.tensor(s, DType::f32), yb.tensor(s, DType::f32));
    layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
    dev.synchronize();

    const Vec ry(ref.y.begin() + off * H, ref.y.begin() + (off + Tr) * H);
    const Vec rdx(ref_dx.begin() + off * H, ref_dx.begin() + (off + Tr) * H);
    EXPECT_LT(rel_err(yb.as<float>(), ry), kTol) << "y";
    EXPECT_LT(rel_err(dxb.as<float>(), rdx), kTol) << "dx";
    const std::int64_t local = E / ep, X = 3 * cfg.ffn * H;
    const Vec rexp(ref_g.experts.begin() + rank * local * X, ref_g.experts.begin() + (rank + 1) * local * X);
    EXPECT_LT(rel_err(gt.experts.data<float>(), rexp), kTol) << "d experts (own)";
    EXPECT_LT(rel_err(world_sum(gt.w_post).data(), ref_g.w_post), kTol) << "d w_post (world sum)";
    EXPECT_LT(rel_err(world_sum(gt.w_gate).data(), ref_g.w_gate), kTol) << "d w_gate (world sum)";
    if (cfg.shared_experts > 0) {
      EXPECT_LT(rel_err(world_sum(gt.shared_gate).data(), ref_g.shared_gate), kTol) << "d shared_gate";
      EXPECT_LT(rel_err(world_sum(gt.shared_up).data(), ref_g.shared_up), kTol) << "d shared_up";
      EXPECT_LT(rel_err(world_sum(gt.shared_down).data(), ref_g.shared_down), kTol) << "d shared_down";
    }
    if (cfg.shared_gate) {
      EXPECT_LT(rel_err(world_sum(gt.shared_expert_gate).data(), ref_g.shared_expert_gate), kTol)
          << "d shared_expert_gate";
    }
    const Tensor ct(counts.as<float>(), Shape{E}, DType::f32, Location::device);
    const Tensor st(sums.as<float>(), Shape{E}, DType::f32, Location::device);
    const std::vector<float> c_all = world_sum(ct), s_all = world_sum(st);
    for (std::int64_t e = 0; e < E; ++e) EXPECT_EQ(c_all[e], static_cast<float>(ref.counts[e])) << "counts " << e;
    EXPECT_LT(rel_err(s_all.data(), ref.prob_sums), kTol) << "prob_sums";
    if (expect_spill && ep > 1 && kind == DispatchKind::llep) {
      EXPECT_TRUE(layer.dispatch_stats()->spilled);
    }
    // The layer's own memory at every rank's token count (0 included): its peak over a
    // forward and a backward is the backward phase of its footprint.
    EXPECT_EQ(dev.arena().peak(Component::layer),
              moe_layer_footprint(Tr, cfg, 4).phase("backward").device[static_cast<std::size_t>(Component::layer)]);
    EXPECT_EQ(dev.arena().live(Component::layer), 0u);
    EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
  }
}

double rel(const float* a, const float* ref, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(double(a[i]) - ref[i]));
    den = std::max(den, std::abs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

struct Bf16Worst {
  double y = 0, dx = 0, cos = 1;
};

// One bf16 layer over the world (each rank its own rows, rank 1 none) against one bf16
// layer at EP 1 holding every expert on all N tokens (run on every rank), from the same
// bf16 values. Per row the two compute the same roundings (row-wise ops, gemm_bf16 per
// row); what differs is fp32 summation order (the combine, the replicated gradients'
// world sum, expert gradients accumulated over other row groupings), which can move a
// stored bf16 by an ulp: y and dx within 1e-2 of max|EP 1| (norm-wise), every gradient
// cosine >= 0.999, the router counts equal, and the measured peak the bf16 footprint.
void expect_bf16_matches_ep1(MoeLayerConfig base, int hot, const char* what, Bf16Worst& w) {
  Communicator& g = world();
  const int ep = g.size(), rank = g.rank();
  std::int64_t N = 0, off = 0;
  for (int r = 0; r < ep; ++r) {
    if (r < rank) off += tokens_of(r);
    N += tokens_of(r);
  }
  const std::int64_t Tr = tokens_of(rank), H = base.hidden, E = base.experts;
  base.precision = Precision::bf16;
  std::mt19937 rng(23);
  Params P = moe_ref::random_params(base, rng, hot);
  Vec x = moe_ref::randn(N * H, rng, hot >= 0 ? 1.0 : 0.0, hot >= 0 ? 0.2 : 1.0);
  Vec dy = moe_ref::randn(N * H, rng, 0, 1), aux_grad = moe_ref::randn(E, rng, 0, 0.5);
  moe_ref::round_to_bf16(P);
  for (Vec* v : {&x, &dy, &aux_grad}) moe_ref::round_to_bf16(*v);
  const Vec zeros(static_cast<std::size_t>(E), 0.0);

  // EP 1 on every rank: all experts, all N tokens.
  CpuDevice dev1(128ull << 20);
  std::vector<Buffer> keep1;
  SingleRankCommunicator one;
  const MoeLayerTensors pt1 = tensors(dev1, keep1, Component::params, base, P, false, 0, 1, DType::bf16);
  const MoeLayerTensors gt1 = tensors(dev1, keep1, Component::grads, base, P, true, 0, 1);
  const Tensor c1 = put(dev1, keep1, Component::workspace, Shape{E}, &zeros);
  const Tensor s1 = put(dev1, keep1, Component::workspace, Shape{E}, &zeros);
  const Tensor ag1 = put(dev1, keep1, Component::workspace, Shape{E}, &aux_grad);
  const MoeAuxState aux1{c1.data<float>(), s1.data<float>(), ag1.data<float>()};
  MoeLayer layer1(dev1, one, base, pt1, gt1, &aux1);
  const Shape sN{N, H};
  const Tensor x1 = put(dev1, keep1, Component::workspace, sN, &x, DType::bf16);
  const Tensor dy1 = put(dev1, keep1, Component::workspace, sN, &dy, DType::bf16);
  const Tensor y1 = put(dev1, keep1, Component::workspace, sN, nullptr, DType::bf16);
  const Tensor dx1 = put(dev1, keep1, Component::workspace, sN, nullptr, DType::bf16);
  layer1.forward(x1, y1);
  layer1.backward(x1, dy1, dx1);
  dev1.synchronize();
  const std::vector<float> ry = host(y1), rdx = host(dx1), rcounts = host(c1);

  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
    SCOPED_TRACE(std::string(what) + " bf16 " + std::string(dispatch_kind_name(kind)) + " EP=" + std::to_string(ep) +
                 " rank=" + std::to_string(rank));
    MoeLayerConfig cfg = base;
    cfg.kind = kind;
    cfg.dispatch.min_spill = 4;
    cfg.dispatch.cap = 7;
    CpuDevice dev(128ull << 20);
    std::vector<Buffer> keep;
    const MoeLayerTensors pt = tensors(dev, keep, Component::params, cfg, P, false, rank, ep, DType::bf16);
    const MoeLayerTensors gt = tensors(dev, keep, Component::grads, cfg, P, true, rank, ep);
    const Tensor ct = put(dev, keep, Component::workspace, Shape{E}, &zeros);
    const Tensor st = put(dev, keep, Component::workspace, Shape{E}, &zeros);
    const Tensor ag = put(dev, keep, Component::workspace, Shape{E}, &aux_grad);
    const MoeAuxState aux{ct.data<float>(), st.data<float>(), ag.data<float>()};
    MoeLayer layer(dev, g, cfg, pt, gt, &aux);
    const Shape s{Tr, H};
    const Tensor xb = put(dev, keep, Component::workspace, s, &x, DType::bf16, off * H);
    const Tensor dyb = put(dev, keep, Component::workspace, s, &dy, DType::bf16, off * H);
    const Tensor yb = put(dev, keep, Component::workspace, s, nullptr, DType::bf16);
    const Tensor dxb = put(dev, keep, Component::workspace, s, nullptr, DType::bf16);
    dev.arena().reset_peaks();
    layer.forward(xb, yb);
    layer.backward(xb, dyb, dxb);
    dev.synchronize();
    EXPECT_EQ(dev.arena().peak(Component::layer),
              moe_layer_footprint(Tr, cfg).phase("backward").device[static_cast<std::size_t>(Component::layer)]);
    EXPECT_EQ(dev.arena().live(Component::layer), 0u);

    const auto n = static_cast<std::size_t>(Tr * H), at = static_cast<std::size_t>(off * H);
    const double ey = rel(host(yb).data(), ry.data() + at, n), edx = rel(host(dxb).data(), rdx.data() + at, n);
    EXPECT_LE(ey, 1e-2) << "y";
    EXPECT_LE(edx, 1e-2) << "dx";
    w.y = std::max(w.y, ey);
    w.dx = std::max(w.dx, edx);
    auto cos = [&](const char* name, const std::vector<float>& got, const std::vector<float>& want) {
      const double c = moe_ref::cosine(got, want);
      EXPECT_GE(c, 0.999) << name;
      w.cos = std::min(w.cos, c);
    };
    const std::int64_t X = (E / ep) * 3 * cfg.ffn * H;
    const std::vector<float> all_experts = host(gt1.experts);
    cos("d experts (own)", host(gt.experts),
        std::vector<float>(all_experts.begin() + rank * X, all_experts.begin() + (rank + 1) * X));
    cos("d w_post (world sum)", world_sum(gt.w_post), host(gt1.w_post));
    cos("d w_gate (world sum)", world_sum(gt.w_gate), host(gt1.w_gate));
    if (cfg.shared_experts > 0) {
      cos("d shared_gate", world_sum(gt.shared_gate), host(gt1.shared_gate));
      cos("d shared_up", world_sum(gt.shared_up), host(gt1.shared_up));
      cos("d shared_down", world_sum(gt.shared_down), host(gt1.shared_down));
    }
    if (cfg.shared_gate) cos("d shared_expert_gate", world_sum(gt.shared_expert_gate), host(gt1.shared_expert_gate));
    EXPECT_EQ(world_sum(ct), rcounts) << "counts";
  }
}

MoeLayerConfig config(std::int64_t K, bool norm, std::int64_t S, std::int64_t Fs, bool gate) {
  MoeLayerConfig c;
  c.hidden = 20;
  c.ffn = 6;
  c.experts = 12;  // divisible by EP in {1, 2, 3, 4}
  c.top_k = K;
  c.norm_topk_prob = norm;
  c.shared_experts = S;
  c.shared_ffn = Fs;
  c.shared_gate = gate;
  return c;
}

TEST(MoeLayerMpi, EveryDispatchKindMatchesTheReference) {
  expect_exact(config(2, true, 0, 0, false), -1, "qwen3 k=2");
  expect_exact(config(4, false, 2, 5, false), -1, "shared k=4");
  expect_exact(config(1, true, 1, 9, true), -1, "gated shared k=1");
}

TEST(MoeLayerMpi, EveryTokenToOneExpert) {
  expect_exact(config(2, true, 1, 7, true), 7, "hot expert 7 k=2", /*expect_spill=*/true);
  expect_exact(config(4, false, 0, 0, false), 0, "hot expert 0 k=4");
}

// The sublayer over row tiles (MoeLayerConfig::seq_tile): 1 row, an odd tile that cuts
// every rank's tokens unevenly, and one larger than any rank's; each against the double
// reference, with the measured peak the footprint of one tile.
TEST(MoeLayerMpi, RowTilesMatchTheReference) {
  for (std::int64_t tile : {1, 4, 7, 64}) {
    expect_exact(config(2, true, 0, 0, false), -1, "qwen3 k=2", false, tile);
    expect_exact(config(1, true, 1, 9, true), -1, "gated shared k=1", false, tile);
  }
  expect_exact(config(4, false, 2, 5, false), -1, "shared k=4", false, 5);
  expect_exact(config(2, true, 1, 7, true), 7, "hot expert 7 k=2", /*expect_spill=*/true, 3);
}

TEST(MoeLayerMpi, Bf16AtEveryEpMatchesBf16AtEp1) {
  Bf16Worst w;
  expect_bf16_matches_ep1(config(2, true, 0, 0, false), -1, "qwen3 k=2", w);
  expect_bf16_matches_ep1(config(4, false, 2, 5, false), -1, "shared k=4", w);
  expect_bf16_matches_ep1(config(1, true, 1, 9, true), -1, "gated shared k=1", w);
  expect_bf16_matches_ep1(config(2, true, 1, 7, true), 7, "hot expert 7 k=2", w);
  if (world().rank() == 0)
    std::printf("moe layer bf16, EP %d vs EP 1: worst y %.3g, dx %.3g of max|ref|, lowest gradient cosine %.7f\n",
                world().size(), w.y, w.dx, w.cos);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
