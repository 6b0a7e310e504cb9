// The MoE FFN sublayer (layers/moe_layer.h) over an expert-parallel group = the world
// (1 rank without mpirun; 2, 3, 4 under mpirun), each rank with a different token count
// and rank 1 with none, for every dispatch kind (standard_ep, llep, pipelined_llep with
// small knobs so that LLEP spills and the pipeline takes several rounds): every rank
// computes the double reference of the whole sublayer on ALL ranks' tokens and compares
// its own rows of y and dx, its own experts' gradients, and the world sums of the
// replicated parameters' gradients and of the router statistics; and the layer's
// measured peak against moe_layer_footprint at each rank's token count.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/moe_layer.h"
#include "tests/comm/world.h"
#include "tests/layers/moe_layer_reference.h"

namespace peakbound {
namespace {

using moe_ref::Params;
using moe_ref::rel_err;
using moe_ref::Vec;
using testing::world;

constexpr double kTol = 1e-5;

// Rank r's tokens: rank 1 has none, the others differ.
std::int64_t tokens_of(int r) { return r == 1 ? 0 : 9 + 7 * r; }

Buffer upload(Device& dev, const double* v, std::size_t n) {
  Buffer b = dev.allocate(Component::workspace, n * 4);
  for (std::size_t i = 0; i < n; ++i) b.as<float>()[i] = static_cast<float>(v[i]);
  return b;
}

Tensor put(Device& dev, std::vector<Buffer>& keep, Component comp, Shape s, const Vec* src, std::int64_t offset) {
  keep.push_back(dev.allocate(comp, static_cast<std::uint64_t>(s.numel()) * 4));
  float* p = keep.back().as<float>();
  for (std::int64_t i = 0; i < s.numel(); ++i) p[i] = src ? static_cast<float>((*src)[offset + i]) : 0.0f;
  return Tensor(p, s, DType::f32, Location::device);
}

MoeLayerTensors tensors(Device& dev, std::vector<Buffer>& keep, Component comp, const MoeLayerConfig& c,
                        const Params& P, bool zero, int rank, int ep) {
  const std::int64_t H = c.hidden, W = c.side_ffn(), local = c.experts / ep, X = 3 * c.ffn * H;
  auto src = [&](const Vec& v) { return zero ? nullptr : &v; };
  MoeLayerTensors t;
  t.w_post = put(dev, keep, comp, Shape{H}, src(P.w_post), 0);
  t.w_gate = put(dev, keep, comp, Shape{c.experts, H}, src(P.w_gate), 0);
  t.experts = put(dev, keep, comp, Shape{local, X}, src(P.experts), rank * local * X);
  if (c.shared_experts > 0) {
    t.shared_gate = put(dev, keep, comp, Shape{W, H}, src(P.shared_gate), 0);
    t.shared_up = put(dev, keep, comp, Shape{W, H}, src(P.shared_up), 0);
    t.shared_down = put(dev, keep, comp, Shape{H, W}, src(P.shared_down), 0);
  }
  if (c.shared_gate) t.shared_expert_gate = put(dev, keep, comp, Shape{1, H}, src(P.shared_expert_gate), 0);
  return t;
}

// World sum of a device tensor, in place on a host copy.
std::vector<float> world_sum(const Tensor& t) {
  std::vector<float> v(t.data<float>(), t.data<float>() + t.numel());
  world().all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
  return v;
}

// expect_spill: LLEP must spill here (with more than one rank), so the test covers lent experts.
void expect_exact(const MoeLayerConfig& base, int hot, const char* what, bool expect_spill = false) {
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
                 " rank=" + std::to_string(rank));
    MoeLayerConfig cfg = base;
    cfg.kind = kind;
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

}  // namespace
}  // namespace peakbound
