#include "peakbound/verify/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/host_attention.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/verify/relative_error.h"

namespace peakbound {

namespace {

std::vector<float> uniform(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::size_t Z(std::int64_t v) { return static_cast<std::size_t>(v); }

}  // namespace

AttentionProblem make_attention_problem(const AttentionDims& dims, std::uint64_t seed) {
  AttentionProblem p;
  p.dims = dims;
  p.dims.kv_tokens = p.dims.q_offset = p.dims.k_offset = 0;
  p.dims.accumulate = false;
  check_attention_dims(p.dims);
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  const std::int64_t S = dims.tokens;
  p.q = uniform(Z(S * dims.q_heads * dims.qk_dim), rng, -2.0f, 2.0f);
  p.k = uniform(Z(S * dims.kv_heads * dims.qk_dim), rng, -2.0f, 2.0f);
  p.v = uniform(Z(S * dims.kv_heads * dims.v_dim), rng, -1.0f, 1.0f);
  p.dout = uniform(Z(S * dims.q_heads * dims.v_dim), rng, -1.0f, 1.0f);
  return p;
}

AttentionResult naive_attention(const AttentionProblem& p) {
  const AttentionDims& a = p.dims;
  const std::int64_t T = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const double scale = a.effective_scale();
  std::vector<double> out(Z(T * Hq * Dv), 0.0), lse(Z(T * Hq)), dq(Z(T * Hq * D), 0.0), dk(Z(T * Hkv * D), 0.0),
      dv(Z(T * Hkv * Dv), 0.0);
  std::vector<double> s(Z(T)), pr(Z(T)), dp(Z(T));
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t g = h / (Hq / Hkv);
    for (std::int64_t i = 0; i < T; ++i) {
      const std::int64_t j_lo = a.window > 0 ? std::max<std::int64_t>(0, i - a.window + 1) : 0;
      double m = -1e300;
      for (std::int64_t j = j_lo; j <= i; ++j) {
        double x = 0;
        for (std::int64_t d = 0; d < D; ++d) x += double(p.q[Z((i * Hq + h) * D + d)]) * p.k[Z((j * Hkv + g) * D + d)];
        s[Z(j)] = scale * x;
        m = std::max(m, s[Z(j)]);
      }
      double sum = 0;
      for (std::int64_t j = j_lo; j <= i; ++j) sum += std::exp(s[Z(j)] - m);
      const double l = m + std::log(sum);
      lse[Z(i * Hq + h)] = l;
      double di = 0;
      for (std::int64_t j = j_lo; j <= i; ++j) {
        pr[Z(j)] = std::exp(s[Z(j)] - l);
        dp[Z(j)] = 0;
        for (std::int64_t d = 0; d < Dv; ++d) {
          const double vj = p.v[Z((j * Hkv + g) * Dv + d)], doi = p.dout[Z((i * Hq + h) * Dv + d)];
          out[Z((i * Hq + h) * Dv + d)] += pr[Z(j)] * vj;
          dp[Z(j)] += doi * vj;
          dv[Z((j * Hkv + g) * Dv + d)] += pr[Z(j)] * doi;
        }
        di += pr[Z(j)] * dp[Z(j)];
      }
      for (std::int64_t j = j_lo; j <= i; ++j) {
        const double ds = pr[Z(j)] * (dp[Z(j)] - di) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          dq[Z((i * Hq + h) * D + d)] += ds * p.k[Z((j * Hkv + g) * D + d)];
          dk[Z((j * Hkv + g) * D + d)] += ds * p.q[Z((i * Hq + h) * D + d)];
        }
      }
    }
  }
  auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  return {f(out), f(lse), f(dq), f(dk), f(dv)};
}

AttentionResult kernel_attention(const AttentionProblem& p, ThreadPool* pool) {
  const AttentionDims& a = p.dims;
  AttentionResult r;
  r.out.resize(p.dout.size());
  r.lse.resize(Z(a.tokens * a.q_heads));
  r.dq.resize(p.q.size());
  r.dk.resize(p.k.size());
  r.dv.resize(p.v.size());
  std::vector<float> ws(Z(attention_workspace_floats(a)));
  ops::host_attention_forward(r.out.data(), r.lse.data(), p.q.data(), p.k.data(), p.v.data(), a, ws.data(), pool);
  ops::host_attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), p.q.data(), p.k.data(),
                               p.v.data(), r.out.data(), r.lse.data(), a, ws.data(), pool);
  return r;
}

double RingAttentionCheck::worst_naive() const { return *std::max_element(naive, naive + 5); }
double RingAttentionCheck::worst_kernel() const { return *std::max_element(kernel, kernel + 5); }

RingAttentionCheck verify_ring_attention(Device& dev, Communicator& g, const AttentionProblem& p,
                                         const AttentionResult& naive, const AttentionResult& kernel, Component io,
                                         ThreadPool* pool, std::int64_t piece_tokens, int query_pieces,
                                         ContextAttention kind) {
  const AttentionDims& a = p.dims;
  RingAttentionConfig cfg;
  cfg.dims = a;
  cfg.seq_len = a.tokens;
  cfg.piece_tokens = piece_tokens;
  cfg.query_pieces = query_pieces;
  const bool ulysses = kind == ContextAttention::ulysses;
  if (ulysses)
    check_ulysses_attention(cfg, g.size());
  else
    check_ring_attention(cfg, g.size());
  const auto forward = [&](float* out, float* lse, const float* q, const float* k, const float* v) {
    if (ulysses)
      ulysses_attention_forward(dev, g, cfg, out, lse, q, k, v, pool);
    else
      ring_attention_forward(dev, g, cfg, out, lse, q, k, v, pool);
  };
  const auto backward = [&](float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* out, const float* lse) {
    if (ulysses)
      ulysses_attention_backward(dev, g, cfg, dq, dk, dv, dout, q, k, v, out, lse, nullptr, pool);
    else
      ring_attention_backward(dev, g, cfg, dq, dk, dv, dout, q, k, v, out, lse, nullptr, pool);
  };
  const CpShard sh = zigzag_shard(a.tokens, g.size(), g.rank());
  const std::int64_t T = sh.tokens();
  const std::int64_t wq = a.q_heads * a.qk_dim, wk = a.kv_heads * a.qk_dim, wv = a.kv_heads * a.v_dim,
                     wo = a.q_heads * a.v_dim, wl = a.q_heads;
  // This rank's rows of a [S, w] tensor, in shard order.
  auto rows = [&](const std::vector<float>& x, std::int64_t w) {
    std::vector<float> y(Z(T * w));
    for (std::int64_t t = 0; t < T; ++t)
      std::copy_n(x.begin() + sh.position(t) * w, w, y.begin() + t * w);
    return y;
  };
  Stream& s = dev.compute_stream();
  auto upload = [&](const std::vector<float>& x) {
    Buffer b = dev.allocate(io, x.size() * sizeof(float));
    dev.memcpy_async(b.data(), x.data(), x.size() * sizeof(float), CopyKind::host_to_device, s);
    return b;
  };
  auto fresh = [&](std::int64_t w) { return dev.allocate(io, Z(T * w) * sizeof(float)); };
  auto download = [&](const Buffer& b, std::int64_t w) {
    std::vector<float> y(Z(T * w));
    dev.memcpy_async(y.data(), b.data(), y.size() * sizeof(float), CopyKind::device_to_host, s);
    dev.synchronize(s);
    return y;
  };
  const std::vector<float> hq = rows(p.q, wq), hk = rows(p.k, wk), hv = rows(p.v, wv), hdo = rows(p.dout, wo);
  Buffer q = upload(hq), k = upload(hk), v = upload(hv), dout = upload(hdo);
  Buffer out = fresh(wo), lse = fresh(wl), dq = fresh(wq), dk = fresh(wk), dv = fresh(wv);
  dev.synchronize(s);
  RingAttentionCheck c;
  std::vector<float> got[5];
  if (query_pieces == 1) {
    dev.arena().reset_peaks();
    forward(out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(), v.as<float>());
    c.forward_peak = dev.arena().peak(Component::attention);
    dev.arena().reset_peaks();
    backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(), q.as<float>(), k.as<float>(),
             v.as<float>(), out.as<float>(), lse.as<float>());
    c.backward_peak = dev.arena().peak(Component::attention);
    got[0] = download(out, wo), got[1] = download(lse, wl), got[2] = download(dq, wq);
  } else {
    // Each query piece's rows packed on the host, its results put back at the rows.
    const auto pack = [](const std::vector<float>& x, std::int64_t w, const RingQueryRows& r) {
      std::vector<float> y(x.begin() + r.row0 * w, x.begin() + (r.row0 + r.n0) * w);
      y.insert(y.end(), x.begin() + r.row1 * w, x.begin() + (r.row1 + r.n1) * w);
      return y;
    };
    const auto unpack = [](std::vector<float>& x, const std::vector<float>& y, std::int64_t w, const RingQueryRows& r) {
      std::copy_n(y.begin(), r.n0 * w, x.begin() + r.row0 * w);
      std::copy_n(y.begin() + r.n0 * w, r.n1 * w, x.begin() + r.row1 * w);
    };
    const auto pieces = [&](auto&& f) {
      for (int i = 0; i < query_pieces; ++i) {
        cfg.query_piece = i;
        f(ring_query_rows(a.tokens, g.size(), g.rank(), query_pieces, i));
      }
    };
    for (int f : {0, 1, 2}) got[f].assign(Z(T * (f == 0 ? wo : f == 1 ? wl : wq)), 0.0f);
    pieces([&](const RingQueryRows& r) {
      const std::int64_t n = r.tokens();
      Buffer qi = upload(pack(hq, wq, r));
      Buffer oi = dev.allocate(io, Z(n * wo) * sizeof(float)), li = dev.allocate(io, Z(n * wl) * sizeof(float));
      dev.arena().reset_peaks();
      forward(oi.as<float>(), li.as<float>(), qi.as<float>(), k.as<float>(), v.as<float>());
      c.forward_peak = std::max(c.forward_peak, dev.arena().peak(Component::attention));
      std::vector<float> ho(Z(n * wo)), hl(Z(n * wl));
      dev.memcpy_async(ho.data(), oi.data(), ho.size() * sizeof(float), CopyKind::device_to_host, s);
      dev.memcpy_async(hl.data(), li.data(), hl.size() * sizeof(float), CopyKind::device_to_host, s);
      dev.synchronize(s);
      unpack(got[0], ho, wo, r);
      unpack(got[1], hl, wl, r);
    });
    ops::fill(dev, s, dk.as<float>(), T * wk, 0.0f);  // summed over the pieces
    ops::fill(dev, s, dv.as<float>(), T * wv, 0.0f);
    pieces([&](const RingQueryRows& r) {
      const std::int64_t n = r.tokens();
      Buffer qi = upload(pack(hq, wq, r)), di = upload(pack(hdo, wo, r)), oi = upload(pack(got[0], wo, r)),
             li = upload(pack(got[1], wl, r));
      Buffer dqi = dev.allocate(io, Z(n * wq) * sizeof(float));
      dev.arena().reset_peaks();
      backward(dqi.as<float>(), dk.as<float>(), dv.as<float>(), di.as<float>(), qi.as<float>(), k.as<float>(),
               v.as<float>(), oi.as<float>(), li.as<float>());
      c.backward_peak = std::max(c.backward_peak, dev.arena().peak(Component::attention));
      std::vector<float> hdq(Z(n * wq));
      dev.memcpy_async(hdq.data(), dqi.data(), hdq.size() * sizeof(float), CopyKind::device_to_host, s);
      dev.synchronize(s);
      unpack(got[2], hdq, wq, r);
    });
  }
  got[3] = download(dk, wk), got[4] = download(dv, wv);
  const std::int64_t widths[5] = {wo, wl, wq, wk, wv};
  const std::vector<float>* nv[5] = {&naive.out, &naive.lse, &naive.dq, &naive.dk, &naive.dv};
  const std::vector<float>* kv[5] = {&kernel.out, &kernel.lse, &kernel.dq, &kernel.dk, &kernel.dv};
  for (int f = 0; f < 5; ++f) {
    const std::vector<float> rn = rows(*nv[f], widths[f]), rk = rows(*kv[f], widths[f]);
    c.naive[f] = verify::group_relative_error(g, got[f].data(), rn.data(), T * widths[f]);
    c.kernel[f] = verify::group_relative_error(g, got[f].data(), rk.data(), T * widths[f]);
  }
  return c;
}

}  // namespace peakbound
