#include "peakbound/verify/vocab_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"
#include "peakbound/verify/relative_error.h"

namespace peakbound {

std::int64_t VocabProblem::offset(int rank) const {
  return std::accumulate(spec.tokens.begin(), spec.tokens.begin() + rank, std::int64_t{0});
}

VocabProblem make_vocab_problem(const VocabProblemSpec& spec, std::int32_t ignore_index) {
  VocabProblem p;
  p.spec = spec;
  const std::int64_t N = std::accumulate(spec.tokens.begin(), spec.tokens.end(), std::int64_t{0});
  const std::int64_t H = spec.hidden, V = spec.vocab;
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::uniform_int_distribution<std::int32_t> td(0, static_cast<std::int32_t>(V - 1));
  p.hidden.resize(static_cast<std::size_t>(N * H));
  for (auto& x : p.hidden) x = nd(rng);
  // Weights scaled so logits have a spread of a few units, as in a trained head.
  p.weight.resize(static_cast<std::size_t>(V * H));
  const float ws = 2.0f / std::sqrt(static_cast<float>(H));
  for (auto& x : p.weight) x = nd(rng) * ws;
  p.targets.resize(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) {
    std::int32_t t = td(rng);
    p.targets[static_cast<std::size_t>(i)] = ud(rng) < spec.ignore_fraction ? ignore_index : t;
  }
  if (spec.all_ignored_rank >= 0 && spec.all_ignored_rank < static_cast<int>(spec.tokens.size())) {
    std::int64_t off = p.offset(spec.all_ignored_rank);
    for (std::int64_t i = 0; i < spec.tokens[static_cast<std::size_t>(spec.all_ignored_rank)]; ++i)
      p.targets[static_cast<std::size_t>(off + i)] = ignore_index;
  }
  return p;
}

VocabReference naive_vocab_reference(const VocabProblem& p, const VocabLossOptions& o, float scale) {
  const std::int64_t N = static_cast<std::int64_t>(p.targets.size()), H = p.spec.hidden, V = p.spec.vocab;
  VocabReference ref;
  ref.d_hidden.assign(static_cast<std::size_t>(N * H), 0.0f);
  std::vector<double> dw(static_cast<std::size_t>(V * H), 0.0), logit(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < N; ++i) {
    const float* h = &p.hidden[static_cast<std::size_t>(i * H)];
    double mx = -INFINITY;
    for (std::int64_t v = 0; v < V; ++v) {
      const float* w = &p.weight[static_cast<std::size_t>(v * H)];
      double s = 0;
      for (std::int64_t k = 0; k < H; ++k) s += static_cast<double>(h[k]) * w[k];
      logit[static_cast<std::size_t>(v)] = s;
      mx = std::max(mx, s);
    }
    double se = 0;
    for (std::int64_t v = 0; v < V; ++v) se += std::exp(logit[static_cast<std::size_t>(v)] - mx);
    const double lse = mx + std::log(se);
    const std::int32_t t = p.targets[static_cast<std::size_t>(i)];
    if (t == o.ignore_index) continue;
    ref.loss += lse - logit[static_cast<std::size_t>(t)] + o.z_loss * lse * lse;
    ++ref.count;
    const double a = 1.0 + 2.0 * o.z_loss * lse;
    std::vector<double> dh(static_cast<std::size_t>(H), 0.0);
    for (std::int64_t v = 0; v < V; ++v) {
      double g = scale * (a * std::exp(logit[static_cast<std::size_t>(v)] - lse) - (v == t ? 1.0 : 0.0));
      const float* w = &p.weight[static_cast<std::size_t>(v * H)];
      double* dwv = &dw[static_cast<std::size_t>(v * H)];
      for (std::int64_t k = 0; k < H; ++k) {
        dh[static_cast<std::size_t>(k)] += g * w[k];
        dwv[k] += g * h[k];
      }
    }
    for (std::int64_t k = 0; k < H; ++k) ref.d_hidden[static_cast<std::size_t>(i * H + k)] = static_cast<float>(dh[static_cast<std::size_t>(k)]);
  }
  ref.d_weight.assign(dw.begin(), dw.end());
  return ref;
}

namespace {
std::uint64_t float_bytes(std::int64_t n) { return static_cast<std::uint64_t>(std::max<std::int64_t>(n, 1)) * 4; }
// At least one element of the precision's activation type (bf16 or f32).
std::uint64_t act_bytes(std::int64_t n, Precision p) {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(n, 1)) * dtype_size(activation_dtype(p));
}
}  // namespace

VocabRankOnDevice::VocabRankOnDevice(Device& dev, const float* h, const std::int32_t* t, std::int64_t tokens,
                                     std::int64_t H, const float* w, std::int64_t rows, Precision p)
    : precision(p) {
  auto put = [&](Component c, const void* src, std::uint64_t bytes, std::int64_t n) {
    Buffer b = dev.allocate(c, bytes);
    copy_to_device(dev, b.data(), src, static_cast<std::uint64_t>(n) * 4);
    return b;
  };
  // hidden and weight in the activation type: copied as they are, or rounded once.
  auto put_act = [&](Component c, const float* src, std::int64_t n) {
    if (p == Precision::f32) return put(c, src, act_bytes(n, p), n);
    std::vector<bf16> low(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < low.size(); ++i) low[i] = to_bf16(src[i]);
    Buffer b = dev.allocate(c, act_bytes(n, p));
    copy_to_device(dev, b.data(), low.data(), low.size() * sizeof(bf16));
    return b;
  };
  static_assert(sizeof(std::int32_t) == sizeof(float));
  hidden = put_act(Component::layer, h, tokens * H);
  targets = put(Component::layer, t, float_bytes(tokens), tokens);
  weight = put_act(Component::params, w, rows * H);
  d_hidden = dev.allocate(Component::layer, act_bytes(tokens * H, p));
  d_weight = dev.allocate(Component::grads, float_bytes(rows * H));
}

std::uint64_t VocabRankOnDevice::bytes(std::int64_t tokens, std::int64_t H, std::int64_t rows, Precision p) {
  return 2 * arena_reserved(act_bytes(tokens * H, p)) + arena_reserved(float_bytes(tokens)) +
         arena_reserved(act_bytes(rows * H, p)) + arena_reserved(float_bytes(rows * H));
}

std::vector<float> VocabRankOnDevice::d_hidden_floats(Device& dev, std::int64_t n) const {
  std::vector<float> out(static_cast<std::size_t>(n));
  if (precision == Precision::f32) {
    copy_to_host(dev, out.data(), d_hidden.data(), out.size() * 4);
    return out;
  }
  std::vector<bf16> low(out.size());
  copy_to_host(dev, low.data(), d_hidden.data(), low.size() * sizeof(bf16));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_f32(low[i]);
  return out;
}

namespace {

VocabCheck check_run(VocabLoss& impl, Communicator& g, const VocabProblem& p, const VocabReference& ref, float scale,
                     bool step, const std::function<void()>& between, float dw_start) {
  const int r = g.rank();
  const std::int64_t H = p.spec.hidden, T = p.spec.tokens[static_cast<std::size_t>(r)], off = p.offset(r);
  VocabShard sh = vocab_shard(p.spec.vocab, g.size(), r);
  std::vector<float> dh(static_cast<std::size_t>(T * H), -1.0f), dw(static_cast<std::size_t>(sh.rows * H), dw_start);
  // This rank's slice on the loss's device, as a model holds it (dh starts as garbage,
  // dw at dw_start: the loss writes the one and adds into the other).
  Device& dev = impl.device();
  VocabRankOnDevice on(dev, p.hidden.data() + off * H, p.targets.data() + off, T, H, p.weight.data() + sh.offset * H,
                       sh.rows);
  copy_to_device(dev, on.d_hidden.data(), dh.data(), dh.size() * 4);
  copy_to_device(dev, on.d_weight.data(), dw.data(), dw.size() * 4);
  LossSum ls;
  if (step) {
    ls = impl.forward_backward(on.hidden.as<float>(), on.targets.as<std::int32_t>(), T, on.weight.as<float>(), scale,
                               on.d_hidden.as<float>(), on.d_weight.as<float>());
  } else {
    ls = impl.forward(on.hidden.as<float>(), on.targets.as<std::int32_t>(), T, on.weight.as<float>());
    if (between) between();
    impl.backward(scale, on.d_hidden.as<float>(), on.d_weight.as<float>());
  }
  copy_to_host(dev, dh.data(), on.d_hidden.data(), dh.size() * 4);
  copy_to_host(dev, dw.data(), on.d_weight.data(), dw.size() * 4);
  if (dw_start != 0.0f)
    for (float& x : dw) x -= dw_start;

  // The group's loss in double precision, summed in rank order (the same bits everywhere).
  const double both[2] = {ls.loss, static_cast<double>(ls.count)};
  std::vector<double> all(2 * static_cast<std::size_t>(g.size()));
  g.all_gather(both, all.data(), 2, DType::f64);
  double loss = 0, count = 0;
  for (int i = 0; i < g.size(); ++i) {
    loss += all[2 * static_cast<std::size_t>(i)];
    count += all[2 * static_cast<std::size_t>(i) + 1];
  }
  VocabCheck c;
  c.rel_err_loss = std::fabs(loss - ref.loss) / std::max(std::fabs(ref.loss), 1e-30);
  if (ref.count == 0) c.rel_err_loss = std::fabs(loss);
  c.count = static_cast<std::int64_t>(count);
  c.count_matches = c.count == ref.count;
  // Errors relative to the whole reference tensor (each rank holds its part).
  c.rel_err_dhidden = verify::group_relative_error(g, dh.data(), ref.d_hidden.data() + off * H, T * H);
  c.rel_err_dweight = verify::group_relative_error(g, dw.data(), ref.d_weight.data() + sh.offset * H, sh.rows * H);
  return c;
}

}  // namespace

VocabCheck check_vocab_loss(VocabLoss& impl, Communicator& g, const VocabProblem& p, const VocabReference& ref,
                            float scale, const std::function<void()>& between) {
  return check_run(impl, g, p, ref, scale, false, between, 0.0f);
}

VocabCheck check_vocab_loss_step(VocabLoss& impl, Communicator& g, const VocabProblem& p, const VocabReference& ref,
                                 float scale, float dw_start) {
  return check_run(impl, g, p, ref, scale, true, {}, dw_start);
}

}  // namespace peakbound
