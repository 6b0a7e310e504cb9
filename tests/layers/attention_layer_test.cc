// The attention sublayer (layers/attention_layer.h) against a naive double reference
// of the whole sublayer: input RMSNorm, Q/K/V projections, the Qwen3 q/k norm, RoPE,
// causal GQA softmax attention with an explicit [T, T] matrix, o_proj and the
// residual; its backward by the explicit chain rule in double, itself checked against
// central finite differences of the double forward. Also: gradients add, and the
// Arena's measured peaks equal attention_layer_footprint.
#include "peakbound/layers/attention_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "tests/layers/attention_layer_harness.h"
#include "tests/layers/layer_checks.h"
#include "tests/layers/reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using reference::randn;   // rounded to float: the layer sees exactly these values
using reference::rel_err;
using reference::Vec;

// The parameters (and, for gradients, the same layout) as host vectors in double.
struct Params {
  Vec w_in, wq, wk, wv, wo, q_norm, k_norm;
};

struct Case {
  std::int64_t T, H, Hq, Hkv, D;
  bool qk_norm;
  std::int64_t piece = kRingPieceTokens;  // AttentionLayerConfig::piece_tokens: the backward's query pieces
  std::string str() const {
    return "T=" + std::to_string(T) + " H=" + std::to_string(H) + " Hq=" + std::to_string(Hq) +
           " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) + " qk_norm=" + std::to_string(qk_norm) +
           " piece=" + std::to_string(piece);
  }
};

constexpr double kTheta = 10000.0;
constexpr double kEps = 1e-6;

// RMSNorm at the layer's eps (reference.h); the backward writes dx.
void rms_fwd(const Vec& x, const Vec& w, std::int64_t c, Vec& out, Vec& rstd) {
  reference::rms_fwd(x, w, c, kEps, out, rstd);
}
void rms_bwd(const Vec& x, const Vec& w, const Vec& rstd, const Vec& dout, std::int64_t c, Vec& dx, Vec& dw) {
  dx.assign(x.size(), 0);
  reference::rms_bwd(x, w, rstd, dout, c, dx, dw);
}

// out[m, n] = sum_k a[m, k] w[n, k]  (nn.Linear).
Vec linear(const Vec& a, const Vec& w, std::int64_t m, std::int64_t n, std::int64_t k) {
  Vec out(static_cast<std::size_t>(m * n), 0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t l = 0; l < k; ++l) out[i * n + j] += a[i * k + l] * w[j * k + l];
  return out;
}

// Rotates x [T, heads, D] by sign * angle (rotate_half convention), in place.
void rope(Vec& x, std::int64_t T, std::int64_t heads, std::int64_t D, double sign) {
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < D / 2; ++i) {
        const double ang = sign * t * std::pow(kTheta, -2.0 * i / D);
        const double c = std::cos(ang), s = std::sin(ang);
        double& x1 = x[(t * heads + h) * D + i];
        double& x2 = x[(t * heads + h) * D + i + D / 2];
        const double a = x1, b = x2;
        x1 = a * c - b * s;
        x2 = b * c + a * s;
      }
}

// The forward's intermediates, kept for the chain rule.
struct Forward {
  Vec h, rstd, q_pre, k_pre, q_rstd, k_rstd, q, k, v, p, o, y;  // p [Hq, T, T]
};

Forward reference_forward(const Case& c, const Vec& x, const Params& P) {
  const std::int64_t T = c.T, H = c.H, D = c.D, Q = c.Hq * D, K = c.Hkv * D;
  Forward f;
  rms_fwd(x, P.w_in, H, f.h, f.rstd);
  f.q_pre = linear(f.h, P.wq, T, Q, H);
  f.k_pre = linear(f.h, P.wk, T, K, H);
  f.v = linear(f.h, P.wv, T, K, H);
  if (c.qk_norm) {
    rms_fwd(f.q_pre, P.q_norm, D, f.q, f.q_rstd);
    rms_fwd(f.k_pre, P.k_norm, D, f.k, f.k_rstd);
  } else {
    f.q = f.q_pre;
    f.k = f.k_pre;
  }
  rope(f.q, T, c.Hq, D, 1.0);
  rope(f.k, T, c.Hkv, D, 1.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  f.p.assign(static_cast<std::size_t>(c.Hq * T * T), 0);
  f.o.assign(static_cast<std::size_t>(T * Q), 0);
  for (std::int64_t hd = 0; hd < c.Hq; ++hd) {
    const std::int64_t g = hd / (c.Hq / c.Hkv);
    for (std::int64_t i = 0; i < T; ++i) {
      double* p = &f.p[(hd * T + i) * T];
      double mx = -1e300;
      for (std::int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (std::int64_t d = 0; d < D; ++d) s += f.q[(i * c.Hq + hd) * D + d] * f.k[(j * c.Hkv + g) * D + d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (std::int64_t j = 0; j <= i; ++j) {
        p[j] /= sum;
        for (std::int64_t d = 0; d < D; ++d) f.o[(i * c.Hq + hd) * D + d] += p[j] * f.v[(j * c.Hkv + g) * D + d];
      }
    }
  }
  f.y = linear(f.o, P.wo, T, H, Q);
  for (std::size_t i = 0; i < f.y.size(); ++i) f.y[i] += x[i];
  return f;
}

// dx (written) and the parameter gradients (written) for dy, by the chain rule.
void reference_backward(const Case& c, const Vec& x, const Params& P, const Vec& dy, Vec& dx, Params& G) {
  const std::int64_t T = c.T, H = c.H, D = c.D, Q = c.Hq * D, K = c.Hkv * D;
  const Forward f = reference_forward(c, x, P);
  G = Params{Vec(P.w_in.size()), Vec(P.wq.size()), Vec(P.wk.size()), Vec(P.wv.size()),
             Vec(P.wo.size()),   Vec(P.q_norm.size()), Vec(P.k_norm.size())};
  // o_proj.
  Vec d_o(static_cast<std::size_t>(T * Q), 0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t a = 0; a < H; ++a)
      for (std::int64_t j = 0; j < Q; ++j) {
        G.wo[a * Q + j] += dy[t * H + a] * f.o[t * Q + j];
        d_o[t * Q + j] += dy[t * H + a] * P.wo[a * Q + j];
      }
  // Softmax attention.
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Vec dq(static_cast<std::size_t>(T * Q), 0), dk(static_cast<std::size_t>(T * K), 0), dv(dk);
  for (std::int64_t hd = 0; hd < c.Hq; ++hd) {
    const std::int64_t g = hd / (c.Hq / c.Hkv);
    for (std::int64_t i = 0; i < T; ++i) {
      const double* p = &f.p[(hd * T + i) * T];
      Vec dp(static_cast<std::size_t>(i + 1), 0);
      double rowdot = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        for (std::int64_t d = 0; d < D; ++d) {
          dp[j] += d_o[(i * c.Hq + hd) * D + d] * f.v[(j * c.Hkv + g) * D + d];
          dv[(j * c.Hkv + g) * D + d] += p[j] * d_o[(i * c.Hq + hd) * D + d];
        }
        rowdot += p[j] * dp[j];
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - rowdot) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          dq[(i * c.Hq + hd) * D + d] += ds * f.k[(j * c.Hkv + g) * D + d];
          dk[(j * c.Hkv + g) * D + d] += ds * f.q[(i * c.Hq + hd) * D + d];
        }
      }
    }
  }
  // RoPE: the transpose of a rotation is the rotation back.
  rope(dq, T, c.Hq, D, -1.0);
  rope(dk, T, c.Hkv, D, -1.0);
  if (c.qk_norm) {
    Vec dqp, dkp;
    rms_bwd(f.q_pre, P.q_norm, f.q_rstd, dq, D, dqp, G.q_norm);
    rms_bwd(f.k_pre, P.k_norm, f.k_rstd, dk, D, dkp, G.k_norm);
    dq = dqp;
    dk = dkp;
  }
  // Projections.
  Vec dh(static_cast<std::size_t>(T * H), 0);
  auto proj = [&](const Vec& d, const Vec& w, Vec& dw, std::int64_t n) {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t a = 0; a < H; ++a) {
          dw[j * H + a] += d[t * n + j] * f.h[t * H + a];
          dh[t * H + a] += d[t * n + j] * w[j * H + a];
        }
  };
  proj(dq, P.wq, G.wq, Q);
  proj(dk, P.wk, G.wk, K);
  proj(dv, P.wv, G.wv, K);
  Vec dxn;
  rms_bwd(x, P.w_in, f.rstd, dh, H, dxn, G.w_in);
  dx = dy;
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dxn[i];
}

Params random_params(const Case& c, std::mt19937& rng) {
  const std::int64_t H = c.H, D = c.D, Q = c.Hq * D, K = c.Hkv * D;
  const double in_h = 1.0 / std::sqrt(double(H)), in_q = 1.0 / std::sqrt(double(Q));
  Params P;
  P.w_in = randn(H, rng, 1.0, 0.1);
  P.wq = randn(Q * H, rng, 0.0, in_h);
  P.wk = randn(K * H, rng, 0.0, in_h);
  P.wv = randn(K * H, rng, 0.0, in_h);
  P.wo = randn(H * Q, rng, 0.0, in_q);
  if (c.qk_norm) {
    P.q_norm = randn(D, rng, 1.0, 0.1);
    P.k_norm = randn(D, rng, 1.0, 0.1);
  }
  return P;
}

AttentionLayerConfig config_of(const Case& c) {
  AttentionLayerConfig cfg;
  cfg.hidden = c.H;
  cfg.q_heads = c.Hq;
  cfg.kv_heads = c.Hkv;
  cfg.head_dim = c.D;
  cfg.rope_theta = kTheta;
  cfg.rms_eps = static_cast<float>(kEps);
  cfg.qk_norm = c.qk_norm;
  cfg.piece_tokens = c.piece;
  return cfg;
}

// Device memory for the parameters and their gradients (a stand-in for the parameter
// store), filled from double vectors.
struct DeviceParams {
  std::vector<Buffer> bufs;
  AttentionLayerTensors t;

  DeviceParams(Device& dev, Component comp, const Case& c, const Params* P) {
    const std::int64_t H = c.H, D = c.D, Q = c.Hq * D, K = c.Hkv * D;
    auto make = [&](Shape s, const Vec* src) {
      bufs.push_back(dev.allocate(comp, static_cast<std::uint64_t>(s.numel()) * 4));
      float* p = bufs.back().as<float>();
      for (std::int64_t i = 0; i < s.numel(); ++i) p[i] = src ? static_cast<float>((*src)[i]) : 0.0f;
      return Tensor(p, s, DType::f32, Location::device);
    };
    t.w_in = make(Shape{H}, P ? &P->w_in : nullptr);
    t.wq = make(Shape{Q, H}, P ? &P->wq : nullptr);
    t.wk = make(Shape{K, H}, P ? &P->wk : nullptr);
    t.wv = make(Shape{K, H}, P ? &P->wv : nullptr);
    t.wo = make(Shape{H, Q}, P ? &P->wo : nullptr);
    if (c.qk_norm) {
      t.q_norm = make(Shape{D}, P ? &P->q_norm : nullptr);
      t.k_norm = make(Shape{D}, P ? &P->k_norm : nullptr);
    }
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  // H = 32 equals Hq * D for (4, 2) at D = 8 and (2, 2) at D = 16, differs elsewhere.
  for (std::int64_t T : {1, 7, 33})
    for (auto [Hq, Hkv] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {2, 2}, {6, 1}})
      for (std::int64_t D : {8, 16})
        for (bool qk : {false, true}) out.push_back({T, 32, Hq, Hkv, D, qk});
  // The backward's queries in pieces (attention_query_pieces): one row, pieces that do not
  // divide the rows, one piece short of the whole.
  for (auto [T, piece] : {std::pair<std::int64_t, std::int64_t>{7, 1}, {33, 5}, {33, 32}, {70, 16}})
    for (bool qk : {false, true}) out.push_back({T, 32, 4, 2, 8, qk, piece});
  return out;
}

constexpr double kTol = 1e-5;

TEST(AttentionLayer, ForwardAndBackwardMatchTheDoubleReference) {
  double worst_fwd = 0, worst_bwd = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.str());
    std::mt19937 rng(static_cast<std::uint32_t>(c.T * 1000 + c.Hq * 100 + c.D * 2 + c.qk_norm));
    const Params P = random_params(c, rng);
    const Vec x = randn(c.T * c.H, rng, 0.0, 1.0), dy = randn(c.T * c.H, rng, 0.0, 1.0);
    const Forward ref = reference_forward(c, x, P);
    Vec ref_dx;
    Params ref_g;
    reference_backward(c, x, P, dy, ref_dx, ref_g);

    CpuDevice dev(64 << 20);
    DeviceParams dp(dev, Component::params, c, &P), dg(dev, Component::grads, c, nullptr);
    AttentionLayer layer(dev, config_of(c), dp.t, dg.t);
    const auto bytes = static_cast<std::uint64_t>(c.T * c.H) * 4;
    Buffer xb = dev.allocate(Component::workspace, bytes), yb = dev.allocate(Component::workspace, bytes);
    Buffer dyb = dev.allocate(Component::workspace, bytes), dxb = dev.allocate(Component::workspace, bytes);
    for (std::int64_t i = 0; i < c.T * c.H; ++i) {
      xb.as<float>()[i] = static_cast<float>(x[i]);
      dyb.as<float>()[i] = static_cast<float>(dy[i]);
    }
    const Shape s{c.T, c.H};
    layer.forward(xb.tensor(s, DType::f32), yb.tensor(s, DType::f32));
    layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
    dev.synchronize();

    const double ey = rel_err(yb.as<float>(), ref.y);
    EXPECT_LT(ey, kTol) << "y";
    worst_fwd = std::max(worst_fwd, ey);
    auto check = [&](const char* name, const float* got, const Vec& want) {
      const double e = rel_err(got, want);
      EXPECT_LT(e, kTol) << name;
      worst_bwd = std::max(worst_bwd, e);
    };
    check("dx", dxb.as<float>(), ref_dx);
    check("d w_in", dg.t.w_in.data<float>(), ref_g.w_in);
    check("d wq", dg.t.wq.data<float>(), ref_g.wq);
    check("d wk", dg.t.wk.data<float>(), ref_g.wk);
    check("d wv", dg.t.wv.data<float>(), ref_g.wv);
    check("d wo", dg.t.wo.data<float>(), ref_g.wo);
    if (c.qk_norm) {
      check("d q_norm", dg.t.q_norm.data<float>(), ref_g.q_norm);
      check("d k_norm", dg.t.k_norm.data<float>(), ref_g.k_norm);
    }
  }
  std::printf("attention layer: worst relative error forward %.3g, backward %.3g over %zu cases\n", worst_fwd,
              worst_bwd, cases().size());
}

// A call of B sequences of S tokens (seq_len S) equals B separate sequences: positions
// restart and nothing attends across a boundary. Reference: the double layer run on
// each sequence alone, outputs concatenated, parameter gradients summed.
TEST(AttentionLayer, SeveralSequencesPerCallMatchOneSequenceEach) {
  for (auto [B, S] : {std::pair<std::int64_t, std::int64_t>{3, 7}, {2, 1}, {4, 16}}) {
    const Case one{S, 20, 4, 2, 8, true};
    SCOPED_TRACE("B=" + std::to_string(B) + " " + one.str());
    std::mt19937 rng(static_cast<std::uint32_t>(B * 100 + S));
    const Params P = random_params(one, rng);
    const std::int64_t T = B * S, H = one.H;
    const Vec x = randn(T * H, rng, 0.0, 1.0), dy = randn(T * H, rng, 0.0, 1.0);
    Vec ref_y, ref_dx;
    Params ref_g;
    for (std::int64_t b = 0; b < B; ++b) {
      const Vec xs(x.begin() + b * S * H, x.begin() + (b + 1) * S * H);
      const Vec dys(dy.begin() + b * S * H, dy.begin() + (b + 1) * S * H);
      const Forward f = reference_forward(one, xs, P);
      ref_y.insert(ref_y.end(), f.y.begin(), f.y.end());
      Vec dxs;
      Params g;
      reference_backward(one, xs, P, dys, dxs, g);
      ref_dx.insert(ref_dx.end(), dxs.begin(), dxs.end());
      if (b == 0) {
        ref_g = g;
        continue;
      }
      for (auto [acc, part] : {std::pair{&ref_g.w_in, &g.w_in}, {&ref_g.wq, &g.wq}, {&ref_g.wk, &g.wk},
                               {&ref_g.wv, &g.wv}, {&ref_g.wo, &g.wo}, {&ref_g.q_norm, &g.q_norm},
                               {&ref_g.k_norm, &g.k_norm}})
        for (std::size_t i = 0; i < acc->size(); ++i) (*acc)[i] += (*part)[i];
    }

    CpuDevice dev(64 << 20);
    DeviceParams dp(dev, Component::params, one, &P), dg(dev, Component::grads, one, nullptr);
    AttentionLayerConfig cfg = config_of(one);
    cfg.seq_len = S;
    AttentionLayer layer(dev, cfg, dp.t, dg.t);
    const auto bytes = static_cast<std::uint64_t>(T * H) * 4;
    Buffer xb = dev.allocate(Component::workspace, bytes), yb = dev.allocate(Component::workspace, bytes);
    Buffer dyb = dev.allocate(Component::workspace, bytes), dxb = dev.allocate(Component::workspace, bytes);
    for (std::int64_t i = 0; i < T * H; ++i) {
      xb.as<float>()[i] = static_cast<float>(x[i]);
      dyb.as<float>()[i] = static_cast<float>(dy[i]);
    }
    const Shape s{T, H};
    layer.forward(xb.tensor(s, DType::f32), yb.tensor(s, DType::f32));
    layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
    dev.synchronize();
    EXPECT_LT(rel_err(yb.as<float>(), ref_y), kTol) << "y";
    EXPECT_LT(rel_err(dxb.as<float>(), ref_dx), kTol) << "dx";
    EXPECT_LT(rel_err(dg.t.wq.data<float>(), ref_g.wq), kTol) << "d wq";
    EXPECT_LT(rel_err(dg.t.wk.data<float>(), ref_g.wk), kTol) << "d wk";
    EXPECT_LT(rel_err(dg.t.wo.data<float>(), ref_g.wo), kTol) << "d wo";
    EXPECT_LT(rel_err(dg.t.q_norm.data<float>(), ref_g.q_norm), kTol) << "d q_norm";
    EXPECT_LT(rel_err(dg.t.w_in.data<float>(), ref_g.w_in), kTol) << "d w_in";
  }
  // A call that is not a whole number of sequences is refused.
  const Case c{5, 20, 4, 2, 8, false};
  CpuDevice dev(16 << 20);
  std::mt19937 rng(3);
  const Params P = random_params(c, rng);
  DeviceParams dp(dev, Component::params, c, &P), dg(dev, Component::grads, c, nullptr);
  AttentionLayerConfig cfg = config_of(c);
  cfg.seq_len = 4;
  AttentionLayer layer(dev, cfg, dp.t, dg.t);
  Buffer xb = dev.allocate(Component::workspace, 5 * 20 * 4), yb = dev.allocate(Component::workspace, 5 * 20 * 4);
  EXPECT_THROW(layer.forward(xb.tensor(Shape{5, 20}, DType::f32), yb.tensor(Shape{5, 20}, DType::f32)),
               InvalidArgument);
}

// The chain-rule reference against central differences of the double forward for
// L = sum(dy * y), on every element of x and of every parameter, for two small cases
// (one with qk_norm). Step 1e-5 in double: truncation ~1e-10 relative, far below 1e-7.
TEST(AttentionLayer, ReferenceBackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{5, 12, 4, 2, 8, true}, Case{4, 10, 6, 1, 4, false}}) {
    SCOPED_TRACE(c.str());
    std::mt19937 rng(7);
    Params P = random_params(c, rng);
    Vec x = randn(c.T * c.H, rng, 0.0, 1.0);
    const Vec dy = randn(c.T * c.H, rng, 0.0, 1.0);
    Vec dx;
    Params G;
    reference_backward(c, x, P, dy, dx, G);
    auto loss = [&] {
      const Vec y = reference_forward(c, x, P).y;
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
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
        const double fd = (lp - lm) / (2 * h);
        num = std::max(num, std::abs(fd - grad[i]));
        den = std::max(den, std::abs(grad[i]));
      }
      EXPECT_LT(num / den, 1e-7) << name;
    };
    fd_check("x", x, dx);
    fd_check("w_in", P.w_in, G.w_in);
    fd_check("wq", P.wq, G.wq);
    fd_check("wk", P.wk, G.wk);
    fd_check("wv", P.wv, G.wv);
    fd_check("wo", P.wo, G.wo);
    if (c.qk_norm) {
      fd_check("q_norm", P.q_norm, G.q_norm);
      fd_check("k_norm", P.k_norm, G.k_norm);
    }
  }
}

// Backward adds into the gradients (a second call doubles them, up to the fp32
// rounding of kernels that accumulate row by row into the gradient) and writes dx
// (bit-identical both times); zero_grad clears them.
TEST(AttentionLayer, BackwardAddsIntoGradientsAndWritesDx) {
  const Case c{7, 20, 4, 2, 8, true};
  std::mt19937 rng(5);
  const Params P = random_params(c, rng);
  CpuDevice dev(16 << 20);
  DeviceParams dp(dev, Component::params, c, &P), dg(dev, Component::grads, c, nullptr);
  AttentionLayer layer(dev, config_of(c), dp.t, dg.t);
  const Shape s{c.T, c.H};
  const auto bytes = static_cast<std::uint64_t>(c.T * c.H) * 4;
  Buffer xb = dev.allocate(Component::workspace, bytes), dyb = dev.allocate(Component::workspace, bytes);
  Buffer dxb = dev.allocate(Component::workspace, bytes);
  const Vec x = randn(c.T * c.H, rng, 0, 1), dy = randn(c.T * c.H, rng, 0, 1);
  for (std::int64_t i = 0; i < c.T * c.H; ++i) xb.as<float>()[i] = float(x[i]), dyb.as<float>()[i] = float(dy[i]);
  auto run = [&] {
    layer.backward(xb.tensor(s, DType::f32), dyb.tensor(s, DType::f32), dxb.tensor(s, DType::f32));
    dev.synchronize();
  };
  run();
  const std::vector<Parameter> params = layer.parameters();
  ASSERT_EQ(params.size(), 7u);
  EXPECT_EQ(params[0].name, "input_layernorm.weight");
  layer_test::expect_backward_adds_into_grads(layer, dev, run, dxb.tensor(s, DType::f32));
}

// Measured Arena peaks of one forward and one backward call equal the footprint, per
// component; nothing under attention outlives a call.
TEST(AttentionLayer, MeasuredPeaksPerPhaseEqualTheFootprint) {
  for (const Case& c : {Case{37, 24, 6, 2, 16, true}, Case{1, 8, 2, 1, 4, false}, Case{70, 64, 4, 4, 16, false},
                        Case{0, 16, 2, 2, 8, true}, Case{37, 24, 6, 2, 16, true, 5},
                        Case{70, 64, 4, 4, 16, false, 16}}) {
    SCOPED_TRACE(c.str());
    CpuDevice dev(64 << 20);
    std::mt19937 rng(3);
    const Params P = random_params(c, rng);
    DeviceParams dp(dev, Component::params, c, &P), dg(dev, Component::grads, c, nullptr);
    AttentionLayer layer(dev, config_of(c), dp.t, dg.t);
    const auto bytes = std::max<std::uint64_t>(static_cast<std::uint64_t>(c.T * c.H) * 4, 4);
    Buffer x = dev.allocate(Component::workspace, bytes), y = dev.allocate(Component::workspace, bytes);
    Buffer dy = dev.allocate(Component::workspace, bytes), dx = dev.allocate(Component::workspace, bytes);
    const Vec xv = randn(c.T * c.H, rng, 0, 1);
    for (std::int64_t i = 0; i < c.T * c.H; ++i) x.as<float>()[i] = dy.as<float>()[i] = float(xv[i]);
    const Footprint f = attention_layer_footprint(c.T, config_of(c), 4);
    const Shape s{c.T, c.H};
    // A call peaks at the largest of its phases; the backward recomputes the forward's.
    auto check = [&](const char* call, bool backward) {
      for (Component comp : {Component::attention, Component::layer})
        EXPECT_EQ(dev.arena().peak(comp),
                  attention_test::call_peak(f, comp, c.T, config_of(c),
                                            backward ? AttentionCall::backward : AttentionCall::forward))
            << call << " " << component_name(comp);
      EXPECT_EQ(dev.arena().live(Component::attention), 0u);
    };
    dev.arena().reset_peaks();
    layer.forward(x.tensor(s, DType::f32), y.tensor(s, DType::f32));
    check("forward", false);
    dev.arena().reset_peaks();
    layer.backward(x.tensor(s, DType::f32), dy.tensor(s, DType::f32), dx.tensor(s, DType::f32));
    check("backward", true);
    dev.synchronize();
    if (c.T > 0) {
      EXPECT_GT(f.device_peak(Component::attention), 0u);
      EXPECT_GT(f.phase("backward").device_total(), f.phase("forward").device_total());
      // Neither h nor o is held through the kernel: the backward's kernel phase holds
      // neither, the forward's holds o but not h, and the projections hold h but not o
      // (o and lse come after h is freed) unless they are the kept ones.
      const AttentionLayerBuffers b = attention_layer_buffers(c.T, config_of(c), 4);
      if (b.query_pieces > 1) {
        // The query side one piece at a time: the backward's kernel phase holds less than
        // the whole call's, and d_o, dq are a piece's rows.
        Case whole = c;
        whole.piece = 0;
        EXPECT_LT(f.phase("backward").device_total(),
                  attention_layer_footprint(c.T, config_of(whole), 4).phase("backward").device_total());
        EXPECT_EQ(b.d_o.bytes, static_cast<std::uint64_t>(b.piece_rows * c.Hq * c.D) * 4);
        EXPECT_LT(b.piece_rows, c.T);
        continue;
      }
      EXPECT_EQ(f.phase("forward project").device_total() + b.o.reserved() + b.lse.reserved() +
                    b.workspace_forward.reserved(),
                f.phase("forward").device_total() + b.h.reserved() + b.rstd.reserved());
      EXPECT_EQ(f.phase(kAttentionKeptProjectPhase).device_total(),
                f.phase("forward project").device_total() + b.o.reserved() + b.lse.reserved());
      EXPECT_EQ(f.phase("backward output").device_total() + b.dq.reserved() + b.dk.reserved() + b.dv.reserved() +
                    b.workspace_backward.reserved(),
                f.phase("backward").device_total() + b.o.reserved());
    }
  }
}

TEST(AttentionLayer, RejectsBadConfigAndParameterShapes) {
  AttentionLayerConfig cfg = config_of(Case{1, 16, 4, 3, 8, false});
  EXPECT_THROW(check_attention_layer_config(cfg), InvalidArgument);  // 3 does not divide 4
  cfg.kv_heads = 2;
  cfg.head_dim = 7;
  EXPECT_THROW(check_attention_layer_config(cfg), InvalidArgument);  // odd D
  const Case c{3, 16, 4, 2, 8, true};
  CpuDevice dev(16 << 20);
  std::mt19937 rng(1);
  const Params P = random_params(c, rng);
  DeviceParams dp(dev, Component::params, c, &P), dg(dev, Component::grads, c, nullptr);
  AttentionLayerTensors bad = dp.t;
  bad.wk = bad.wk.view(Shape{16, 16});  // [Hkv*D, H] is [16, 16] here: use a wrong one
  bad.wq = bad.wk;                      // wq wants [32, 16]
  EXPECT_THROW(AttentionLayer(dev, config_of(c), bad, dg.t), InvalidArgument);
  AttentionLayerTensors no_norm = dg.t;
  no_norm.k_norm = Tensor();
  EXPECT_THROW(AttentionLayer(dev, config_of(c), dp.t, no_norm), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
