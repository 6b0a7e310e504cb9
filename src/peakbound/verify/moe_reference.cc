#include "peakbound/verify/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/verify/relative_error.h"

namespace peakbound {

std::string_view skew_name(Skew s) {
  switch (s) {
    case Skew::uniform: return "uniform";
    case Skew::zipf: return "zipf";
    case Skew::hot: return "hot";
    case Skew::all_to_one_rank: return "all-to-one-rank";
    case Skew::one_expert: return "one-expert";
    case Skew::source: return "source";
  }
  return "?";
}

Skew parse_skew(std::string_view s) {
  for (Skew k : {Skew::uniform, Skew::zipf, Skew::hot, Skew::all_to_one_rank, Skew::one_expert, Skew::source})
    if (skew_name(k) == s) return k;
  throw InvalidArgument("skew '" + std::string(s) +
                        "' is not uniform, zipf, hot, all-to-one-rank, one-expert or source");
}

std::int64_t MoeProblem::offset(int rank) const {
  return std::accumulate(tokens.begin(), tokens.begin() + rank, std::int64_t{0});
}

namespace {

// K distinct experts: first from `preferred` (in random order), then uniformly from the rest.
void pick(std::mt19937_64& rng, std::int64_t E, std::int64_t K, std::vector<std::int64_t> preferred,
          std::int32_t* out) {
  std::shuffle(preferred.begin(), preferred.end(), rng);
  std::int64_t n = 0;
  for (std::int64_t e : preferred) {
    if (n == K) break;
    out[n++] = static_cast<std::int32_t>(e);
  }
  std::uniform_int_distribution<std::int64_t> any(0, E - 1);
  while (n < K) {
    std::int64_t e = any(rng);
    if (std::find(out, out + n, e) == out + n) out[n++] = static_cast<std::int32_t>(e);
  }
}

}  // namespace

MoeProblem make_moe_problem(const MoeProblemSpec& spec) {
  const MoeShape& s = spec.shape;
  const std::int64_t H = s.hidden, E = s.experts, K = s.top_k, local = E / spec.ranks;
  PB_CHECK(E % spec.ranks == 0 && K <= E);
  MoeProblem p;
  p.spec = spec;
  p.tokens.assign(static_cast<std::size_t>(spec.ranks), spec.tokens);
  if (spec.skew == Skew::source && spec.ranks > 1) {
    p.tokens[0] = 8 * spec.tokens;
    p.tokens[1] = 0;
  }
  const std::int64_t N = std::accumulate(p.tokens.begin(), p.tokens.end(), std::int64_t{0});
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  p.x.resize(static_cast<std::size_t>(N * H));
  for (auto& v : p.x) v = nd(rng);
  p.dy.resize(static_cast<std::size_t>(N * H));
  for (auto& v : p.dy) v = nd(rng);
  p.params.resize(static_cast<std::size_t>(E * s.expert_floats()));
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  for (auto& v : p.params) v = nd(rng) * ws;
  p.ids.resize(static_cast<std::size_t>(N * K));
  p.weights.resize(static_cast<std::size_t>(N * K));
  std::vector<std::int64_t> hot(static_cast<std::size_t>(local));
  std::iota(hot.begin(), hot.end(), 0);  // rank 0's experts
  if (!std::isfinite(spec.zipf_s) || spec.zipf_s < 0)
    throw InvalidArgument("moe problem zipf_s must be a finite number >= 0 (got " + std::to_string(spec.zipf_s) + ")");
  std::vector<double> zipf_cdf(static_cast<std::size_t>(E)), zipf_w(static_cast<std::size_t>(E));
  double z = 0;
  for (std::int64_t e = 0; e < E; ++e)
    zipf_cdf[static_cast<std::size_t>(e)] = (z += (zipf_w[static_cast<std::size_t>(e)] = 1.0 / std::pow(e + 1.0, spec.zipf_s)));
  for (std::int64_t t = 0; t < N; ++t) {
    std::int32_t* ids = &p.ids[static_cast<std::size_t>(t * K)];
    switch (spec.skew) {
      case Skew::uniform:
      case Skew::source: pick(rng, E, K, {}, ids); break;
      case Skew::hot: pick(rng, E, K, ud(rng) < spec.hot_share ? hot : std::vector<std::int64_t>{}, ids); break;
      case Skew::all_to_one_rank: pick(rng, E, K, hot, ids); break;
      case Skew::one_expert: {
        ids[0] = 0;
        std::int64_t n = 1;
        std::uniform_int_distribution<std::int64_t> any(1, E - 1);
        while (n < K) {
          std::int32_t e = static_cast<std::int32_t>(any(rng));
          if (std::find(ids, ids + n, e) == ids + n) ids[n++] = e;
        }
        break;
      }
      case Skew::zipf: {
        // Rejection keeps the common case cheap; a head heavy enough to reject 64 times
        // in a row switches to an exact draw without replacement (bounded for any s).
        std::int64_t n = 0;
        for (int tries = 0; n < K && tries < 64; ++tries) {
          double u = ud(rng) * z;
          auto e = static_cast<std::int32_t>(std::lower_bound(zipf_cdf.begin(), zipf_cdf.end(), u) - zipf_cdf.begin());
          e = std::min<std::int32_t>(e, static_cast<std::int32_t>(E - 1));
          if (std::find(ids, ids + n, e) == ids + n) ids[n++] = e;
        }
        while (n < K) {
          double mass = 0;
          for (std::int64_t e = 0; e < E; ++e)
            if (std::find(ids, ids + n, e) == ids + n) mass += zipf_w[static_cast<std::size_t>(e)];
          const bool weighted = mass > 0 && std::isfinite(mass);
          // Weighted: the first expert whose cumulative weight passes u; otherwise uniform
          // over the experts left (their weights all underflowed to 0).
          double u = ud(rng) * (weighted ? mass : static_cast<double>(E - n));
          std::int32_t pick_e = -1;
          for (std::int64_t e = 0; e < E; ++e) {
            if (std::find(ids, ids + n, e) != ids + n) continue;
            pick_e = static_cast<std::int32_t>(e);
            u -= weighted ? zipf_w[static_cast<std::size_t>(e)] : 1.0;
            if (u < 0 && (!weighted || zipf_w[static_cast<std::size_t>(e)] > 0)) break;
          }
          ids[n++] = pick_e;
        }
        break;
      }
    }
    // Renormalized positive gate weights.
    float* w = &p.weights[static_cast<std::size_t>(t * K)];
    float sum = 0;
    for (std::int64_t k = 0; k < K; ++k) sum += (w[k] = 0.1f + static_cast<float>(ud(rng)));
    for (std::int64_t k = 0; k < K; ++k) w[k] /= sum;
  }
  return p;
}

Footprint moe_problem_footprint(const MoeProblem& p, int rank, DispatchKind kind, const DispatchOptions& options,
                                std::uint64_t elem_bytes) {
  const MoeShape& s = p.spec.shape;
  const int P = p.spec.ranks;
  const std::int64_t E = s.experts, K = s.top_k;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(P * E), 0);
  for (int q = 0; q < P; ++q) {
    const std::int64_t off = p.offset(q), T = p.tokens[static_cast<std::size_t>(q)];
    for (std::int64_t c = 0; c < T * K; ++c) ++counts[static_cast<std::size_t>(q * E + p.ids[static_cast<std::size_t>(off * K + c)])];
  }
  const MoePlan plan = dispatch_plan(kind, s, P, counts, options, elem_bytes);
  return dispatch_footprint(s, dispatch_sizes(plan, rank, p.tokens[static_cast<std::size_t>(rank)]), elem_bytes);
}

MoeReference dense_moe_reference(const MoeProblem& p) {
  const MoeShape& s = p.spec.shape;
  const std::int64_t H = s.hidden, F = s.ffn, K = s.top_k, EF = s.expert_floats();
  const std::int64_t N = static_cast<std::int64_t>(p.x.size()) / H;
  MoeReference ref;
  ref.y.assign(static_cast<std::size_t>(N * H), 0.0f);
  ref.dx.assign(static_cast<std::size_t>(N * H), 0.0f);
  ref.dw.assign(static_cast<std::size_t>(N * K), 0.0f);
  std::vector<double> dparams(p.params.size(), 0.0), g(static_cast<std::size_t>(F)), u(static_cast<std::size_t>(F)),
      a(static_cast<std::size_t>(F)), da(static_cast<std::size_t>(F)), o(static_cast<std::size_t>(H)),
      dx(static_cast<std::size_t>(H));
  for (std::int64_t t = 0; t < N; ++t) {
    const float* x = &p.x[static_cast<std::size_t>(t * H)];
    const float* dy = &p.dy[static_cast<std::size_t>(t * H)];
    std::fill(dx.begin(), dx.end(), 0.0);
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t e = p.ids[static_cast<std::size_t>(t * K + k)];
      const double w = p.weights[static_cast<std::size_t>(t * K + k)];
      const float* W = &p.params[static_cast<std::size_t>(e * EF)];
      const float *Wg = W, *Wu = W + F * H, *Wd = W + 2 * F * H;
      double* dW = &dparams[static_cast<std::size_t>(e * EF)];
      double *dWg = dW, *dWu = dW + F * H, *dWd = dW + 2 * F * H;
      for (std::int64_t f = 0; f < F; ++f) {
        double sg = 0, su = 0;
        for (std::int64_t h = 0; h < H; ++h) sg += static_cast<double>(Wg[f * H + h]) * x[h], su += static_cast<double>(Wu[f * H + h]) * x[h];
        g[static_cast<std::size_t>(f)] = sg;
        u[static_cast<std::size_t>(f)] = su;
        a[static_cast<std::size_t>(f)] = sg / (1.0 + std::exp(-sg)) * su;
      }
      double dwk = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        double s2 = 0;
        for (std::int64_t f = 0; f < F; ++f) s2 += static_cast<double>(Wd[h * F + f]) * a[static_cast<std::size_t>(f)];
        o[static_cast<std::size_t>(h)] = s2;
        ref.y[static_cast<std::size_t>(t * H + h)] += static_cast<float>(w * s2);
        dwk += dy[h] * s2;
      }
      ref.dw[static_cast<std::size_t>(t * K + k)] = static_cast<float>(dwk);
      // dout = w dy; dWd += dout a^T; da = Wd^T dout; then SwiGLU and the input GEMMs.
      std::fill(da.begin(), da.end(), 0.0);
      for (std::int64_t h = 0; h < H; ++h) {
        const double dout = w * dy[h];
        for (std::int64_t f = 0; f < F; ++f) {
          dWd[h * F + f] += dout * a[static_cast<std::size_t>(f)];
          da[static_cast<std::size_t>(f)] += dout * Wd[h * F + f];
        }
      }
      for (std::int64_t f = 0; f < F; ++f) {
        const double gf = g[static_cast<std::size_t>(f)], uf = u[static_cast<std::size_t>(f)];
        const double sig = 1.0 / (1.0 + std::exp(-gf));
        const double dg = da[static_cast<std::size_t>(f)] * uf * sig * (1.0 + gf * (1.0 - sig));
        const double du = da[static_cast<std::size_t>(f)] * gf * sig;
        for (std::int64_t h = 0; h < H; ++h) {
          dWg[f * H + h] += dg * x[h];
          dWu[f * H + h] += du * x[h];
          dx[static_cast<std::size_t>(h)] += dg * Wg[f * H + h] + du * Wu[f * H + h];
        }
      }
    }
    for (std::int64_t h = 0; h < H; ++h) ref.dx[static_cast<std::size_t>(t * H + h)] = static_cast<float>(dx[static_cast<std::size_t>(h)]);
  }
  ref.dparams.assign(dparams.begin(), dparams.end());
  return ref;
}

double MoeCheck::max() const { return std::max({rel_err_y, rel_err_dx, rel_err_dw, rel_err_dparams}); }

namespace {

struct RankSlice {
  std::int64_t T, H, K, off, local, EF;
};

RankSlice slice_of(const MoeProblem& p, int rank, int ranks) {
  const MoeShape& s = p.spec.shape;
  return {p.tokens[static_cast<std::size_t>(rank)], s.hidden, s.top_k, p.offset(rank), s.experts / ranks,
          s.expert_floats()};
}

std::uint64_t floats(std::int64_t n) { return static_cast<std::uint64_t>(std::max<std::int64_t>(n, 1)) * 4; }

}  // namespace

std::uint64_t MoeRankOnDevice::bytes(const MoeProblem& p, int rank, int ranks) {
  const RankSlice r = slice_of(p, rank, ranks);
  // x, dy, y, dx [T, H]; ids, weights, d weights [T, K]; experts and their gradients.
  return 4 * arena_reserved(floats(r.T * r.H)) + 3 * arena_reserved(floats(r.T * r.K)) +
         2 * arena_reserved(floats(r.local * r.EF));
}

MoeRankOnDevice::MoeRankOnDevice(Device& dev, const MoeProblem& p, int rank, int ranks) : dev_(dev) {
  const RankSlice r = slice_of(p, rank, ranks);
  T_ = r.T, H_ = r.H, K_ = r.K, expert_floats_ = r.local * r.EF;
  auto put = [&](Component c, const void* src, std::int64_t n) {
    Buffer b = dev_.allocate(c, floats(n));
    copy_to_device(dev_, b.data(), src, static_cast<std::uint64_t>(n) * 4);
    return b;
  };
  static_assert(sizeof(std::int32_t) == sizeof(float));
  x_ = put(Component::layer, p.x.data() + r.off * r.H, r.T * r.H);
  ids_ = put(Component::layer, p.ids.data() + r.off * r.K, r.T * r.K);
  w_ = put(Component::layer, p.weights.data() + r.off * r.K, r.T * r.K);
  dy_ = put(Component::layer, p.dy.data() + r.off * r.H, r.T * r.H);
  params_ = put(Component::params, p.params.data() + rank * r.local * r.EF, expert_floats_);
  y_ = dev_.allocate(Component::layer, floats(r.T * r.H));
  dx_ = dev_.allocate(Component::layer, floats(r.T * r.H));
  dw_ = dev_.allocate(Component::layer, floats(r.T * r.K));
  dparams_ = dev_.allocate(Component::grads, floats(expert_floats_));
}

void MoeRankOnDevice::forward(MoeDispatch& d, Buffer* kept) {
  d.forward(x_.as<float>(), T_, ids_.as<std::int32_t>(), w_.as<float>(), params_.as<float>(), y_.as<float>(), kept);
}

void MoeRankOnDevice::backward(MoeDispatch& d, Buffer* kept) {
  if (expert_floats_ > 0) ops::fill(dev_, dev_.compute_stream(), dparams_.as<float>(), expert_floats_, 0.0f);
  d.backward(x_.as<float>(), T_, ids_.as<std::int32_t>(), w_.as<float>(), params_.as<float>(), dy_.as<float>(),
             dx_.as<float>(), dw_.as<float>(), dparams_.as<float>(), kept);
}

std::vector<float> MoeRankOnDevice::read(const Buffer& b, std::int64_t n) const {
  std::vector<float> out(static_cast<std::size_t>(n));
  copy_to_host(dev_, out.data(), b.data(), out.size() * sizeof(float));
  return out;
}

MoeCheck check_moe_dispatch(MoeDispatch& d, Communicator& g, const MoeProblem& p, const MoeReference& ref) {
  const MoeShape& s = p.spec.shape;
  const int r = g.rank();
  const std::int64_t H = s.hidden, K = s.top_k, EF = s.expert_floats(), local = s.experts / g.size();
  const std::int64_t T = p.tokens[static_cast<std::size_t>(r)], off = p.offset(r);
  MoeRankOnDevice on(d.device(), p, r, g.size());
  on.forward(d);
  const std::vector<float> y = on.y();
  on.backward(d);
  const std::vector<float> dx = on.dx(), dw = on.dw(), dparams = on.dparams();
  MoeCheck c;
  c.rel_err_y = verify::group_relative_error(g, y.data(), ref.y.data() + off * H, T * H);
  c.rel_err_dx = verify::group_relative_error(g, dx.data(), ref.dx.data() + off * H, T * H);
  c.rel_err_dw = verify::group_relative_error(g, dw.data(), ref.dw.data() + off * K, T * K);
  c.rel_err_dparams = verify::group_relative_error(g, dparams.data(), ref.dparams.data() + r * local * EF, local * EF);
  return c;
}

}  // namespace peakbound
