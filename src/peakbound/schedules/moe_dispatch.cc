#include "peakbound/schedules/moe_dispatch.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_stream.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/swiglu.h"

namespace peakbound {

struct MoeDispatch::Pass {
  bool backward = false;
  const float* x = nullptr;
  std::int64_t tokens = 0;
  const std::int32_t* ids = nullptr;
  const float* w = nullptr;
  const float* params = nullptr;
  const float* dy = nullptr;
  float* y = nullptr;
  float* dx = nullptr;
  float* dw = nullptr;
  float* dparams = nullptr;
};

MoeDispatch::MoeDispatch(Device& dev, Communicator& ep_group, MoeShape shape, DispatchKind kind, LlepKnobs knobs)
    : dev_(dev), g_(ep_group), s_(shape), kind_(kind), knobs_(knobs) {
  if (s_.hidden < 1 || s_.ffn < 1 || s_.experts < 1 || s_.top_k < 1)
    throw InvalidArgument("moe: hidden, ffn, experts and top-k must be positive");
  if (s_.top_k > s_.experts) throw InvalidArgument("moe: top-k " + std::to_string(s_.top_k) + " exceeds the " +
                                                   std::to_string(s_.experts) + " experts");
  if (s_.experts % g_.size() != 0)
    throw InvalidArgument("moe: the expert-parallel size " + std::to_string(g_.size()) + " does not divide the " +
                          std::to_string(s_.experts) + " experts");
  if (knobs_.cap < 1) throw InvalidArgument("moe: --cap must be positive");
  if (knobs_.alpha < 1.0) throw InvalidArgument("moe: --alpha must be at least 1");
  if (knobs_.min_spill < 1) throw InvalidArgument("moe: --min-spill must be positive");
}

void MoeDispatch::forward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                          const float* expert_params, float* y) {
  Pass p;
  p.x = x, p.tokens = tokens, p.ids = expert_ids, p.w = weights, p.params = expert_params, p.y = y;
  run(p);
}

void MoeDispatch::backward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                           const float* expert_params, const float* dy, float* dx, float* d_weights,
                           float* d_expert_params) {
  Pass p;
  p.backward = true;
  p.x = x, p.tokens = tokens, p.ids = expert_ids, p.w = weights, p.params = expert_params, p.dy = dy;
  p.dx = dx, p.dw = d_weights, p.dparams = d_expert_params;
  run(p);
}

namespace {

std::vector<std::size_t> prefix(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

}  // namespace

void MoeDispatch::run(Pass& p) {
  const int P = g_.size(), r = g_.rank();
  const std::int64_t H = s_.hidden, F = s_.ffn, E = s_.experts, K = s_.top_k, T = p.tokens;
  const std::int64_t EF = s_.expert_floats();

  // 1. Counts per (source, expert), gathered so every rank derives the same plan.
  std::int64_t bad = -1;
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
  for (std::int64_t c = 0; c < T * K; ++c) {
    std::int32_t e = p.ids[c];
    if (e < 0 || e >= E) {
      bad = c;
      break;
    }
    by_expert[static_cast<std::size_t>(e)].push_back(c);
  }
  std::int64_t any_bad = bad >= 0;
  g_.all_reduce(&any_bad, 1, DType::i64, ReduceOp::max);
  if (bad >= 0)
    throw InvalidArgument("moe: expert id " + std::to_string(p.ids[bad]) + " of token " + std::to_string(bad / K) +
                          " is outside [0, " + std::to_string(E) + ")");
  if (any_bad) throw InvalidArgument("moe: an expert id on another rank is out of range");
  std::vector<std::int64_t> mine(static_cast<std::size_t>(E)), all(static_cast<std::size_t>(P * E));
  for (std::int64_t e = 0; e < E; ++e) mine[static_cast<std::size_t>(e)] = static_cast<std::int64_t>(by_expert[static_cast<std::size_t>(e)].size());
  g_.all_gather(mine.data(), all.data(), static_cast<std::size_t>(E), DType::i64);
  const MoePlan plan = make_moe_plan(kind_, P, E, all, knobs_);

  // 2. This rank's copies per destination, in (expert, local order) order.
  std::vector<std::vector<std::int64_t>> to(static_cast<std::size_t>(P));
  for (std::int64_t e = 0; e < E; ++e) {
    const auto& cs = by_expert[static_cast<std::size_t>(e)];
    std::int64_t g0 = 0;
    for (int q = 0; q < r; ++q) g0 += plan.count(q, e);
    const auto& pcs = plan.pieces[static_cast<std::size_t>(e)];
    std::size_t pi = 0;
    for (std::size_t j = 0; j < cs.size(); ++j) {
      const std::int64_t g = g0 + static_cast<std::int64_t>(j);
      while (pcs[pi].end <= g) ++pi;
      to[static_cast<std::size_t>(pcs[pi].dest)].push_back(cs[j]);
    }
  }

  // 3. Weights of the experts this rank helps with, sent once by their owners.
  const std::vector<std::int64_t> foreign = plan.foreign_experts(r);
  const std::int64_t nf = static_cast<std::int64_t>(foreign.size());
  Buffer fweights = dev_.allocate(Component::dispatch, static_cast<std::uint64_t>(nf * EF) * 4);
  Buffer fgrads = p.backward ? dev_.allocate(Component::dispatch, static_cast<std::uint64_t>(nf * EF) * 4) : Buffer();
  if (p.backward && nf) std::memset(fgrads.data(), 0, static_cast<std::size_t>(nf * EF) * 4);
  std::vector<std::size_t> wsc(static_cast<std::size_t>(P), 0), wrc(static_cast<std::size_t>(P), 0);
  std::vector<std::int64_t> lent;  // experts this rank lends, grouped by helper ascending
  for (int d = 0; d < P; ++d)
    for (const auto& sp : plan.spills)
      if (sp.owner == r && sp.helper == d) {
        lent.push_back(sp.expert);
        wsc[static_cast<std::size_t>(d)] += static_cast<std::size_t>(EF);
      }
  for (const auto& sp : plan.spills)
    if (sp.helper == r) wrc[static_cast<std::size_t>(sp.owner)] += static_cast<std::size_t>(EF);
  if (!plan.spills.empty()) {
    Buffer wsend = dev_.allocate(Component::dispatch, static_cast<std::uint64_t>(lent.size()) * static_cast<std::uint64_t>(EF) * 4);
    for (std::size_t i = 0; i < lent.size(); ++i)
      std::memcpy(wsend.as<float>() + static_cast<std::int64_t>(i) * EF, p.params + (lent[i] - r * plan.local) * EF,
                  static_cast<std::size_t>(EF) * 4);
    g_.all_to_all_v(wsend.data(), wsc, prefix(wsc), fweights.data(), wrc, prefix(wrc), DType::f32);
  }
  auto slot_of = [&](std::int64_t e) -> std::int64_t {
    if (plan.owner(e) == r) return e - r * plan.local;
    auto it = std::lower_bound(foreign.begin(), foreign.end(), e);
    PB_CHECK_MSG(it != foreign.end() && *it == e, "row for an expert this rank neither owns nor helps with");
    return plan.local + (it - foreign.begin());
  };
  const std::int64_t slots = plan.local + nf;
  auto weights_of = [&](std::int64_t slot) {
    return slot < plan.local ? p.params + slot * EF : fweights.as<float>() + (slot - plan.local) * EF;
  };
  auto grads_of = [&](std::int64_t slot) {
    return slot < plan.local ? p.dparams + slot * EF : fgrads.as<float>() + (slot - plan.local) * EF;
  };

  // 4. Round buffers, sized once for the largest round and reused. Pipelined rounds
  //    double-buffer the exchange so round i+1's dispatch and round i-1's combine run on
  //    the communication thread while round i's experts compute.
  const std::int64_t win = p.backward ? 2 * H + 2 : H + 1;   // x [, dy, w], expert id
  const std::int64_t wout = p.backward ? H + 1 : H;           // dx, dw | out
  const std::int64_t ms = plan.max_sent(), mr = plan.max_received();
  const bool overlap = kind_ == DispatchKind::pipelined_llep && plan.rounds > 1;
  const int nbuf = overlap ? 2 : 1;
  auto alloc = [&](std::int64_t floats) { return dev_.allocate(Component::dispatch, static_cast<std::uint64_t>(floats) * 4); };
  Buffer sendbuf[2], recvbuf[2], backbuf[2], outbuf[2];
  for (int b = 0; b < nbuf; ++b) {
    sendbuf[b] = alloc(ms * win);
    recvbuf[b] = alloc(mr * win);
    backbuf[b] = alloc(ms * wout);
    outbuf[b] = alloc(mr * wout);
  }
  Buffer xg = alloc(mr * H), dyg = p.backward ? alloc(mr * H) : Buffer(), gate = alloc(mr * F), up = alloc(mr * F),
         act = alloc(mr * F), outg = alloc(mr * H);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(mr)), slot_rows(static_cast<std::size_t>(slots + 1));
  std::vector<float> wg(static_cast<std::size_t>(mr)), dwg(static_cast<std::size_t>(mr));

  if (p.backward) {
    if (T) std::memset(p.dx, 0, static_cast<std::size_t>(T * H) * 4);
  } else if (T) {
    std::memset(p.y, 0, static_cast<std::size_t>(T * H) * 4);
  }

  // Per-round counts (elements) of the dispatch and of the combine.
  auto counts = [&](int i, bool combine) {
    std::vector<std::size_t> sc(static_cast<std::size_t>(P)), rc(static_cast<std::size_t>(P));
    for (int d = 0; d < P; ++d) {
      sc[static_cast<std::size_t>(d)] = static_cast<std::size_t>(combine ? plan.slice(d, r, i) * wout : plan.slice(r, d, i) * win);
      rc[static_cast<std::size_t>(d)] = static_cast<std::size_t>(combine ? plan.slice(r, d, i) * wout : plan.slice(d, r, i) * win);
    }
    return std::pair{sc, rc};
  };
  auto dispatch = [&](int i) {
    auto [sc, rc] = counts(i, false);
    g_.all_to_all_v(sendbuf[i % nbuf].data(), sc, prefix(sc), recvbuf[i % nbuf].data(), rc, prefix(rc), DType::f32);
  };
  auto combine = [&](int i) {
    auto [sc, rc] = counts(i, true);
    g_.all_to_all_v(outbuf[i % nbuf].data(), sc, prefix(sc), backbuf[i % nbuf].data(), rc, prefix(rc), DType::f32);
  };

  // a. Pack this round's slice of every (this rank, d) block.
  auto pack = [&](int i) {
    float* sb = sendbuf[i % nbuf].as<float>();
    std::int64_t row = 0;
    for (int d = 0; d < P; ++d) {
      const auto& list = to[static_cast<std::size_t>(d)];
      for (std::int64_t j = plan.slice_begin(r, d, i); j < plan.slice_begin(r, d, i + 1); ++j, ++row) {
        const std::int64_t c = list[static_cast<std::size_t>(j)], t = c / K;
        float* dst = sb + row * win;
        std::memcpy(dst, p.x + t * H, static_cast<std::size_t>(H) * 4);
        if (p.backward) {
          std::memcpy(dst + H, p.dy + t * H, static_cast<std::size_t>(H) * 4);
          dst[2 * H] = p.w[c];
        }
        dst[win - 1] = static_cast<float>(p.ids[c]);
      }
    }
  };

  // b. The experts of this rank on one round's received rows.
  auto compute = [&](int i) {
    // Group the received rows by expert slot (counting sort, stable).
    const std::int64_t n = plan.received(r, i);
    const float* rb = recvbuf[i % nbuf].as<float>();
    std::fill(slot_rows.begin(), slot_rows.end(), 0);
    std::vector<std::int64_t> slot(static_cast<std::size_t>(n));
    for (std::int64_t q = 0; q < n; ++q) {
      slot[static_cast<std::size_t>(q)] = slot_of(static_cast<std::int64_t>(rb[q * win + win - 1]));
      ++slot_rows[static_cast<std::size_t>(slot[static_cast<std::size_t>(q)] + 1)];
    }
    std::partial_sum(slot_rows.begin(), slot_rows.end(), slot_rows.begin());
    std::vector<std::int64_t> fill(slot_rows.begin(), slot_rows.end() - 1);
    for (std::int64_t q = 0; q < n; ++q) {
      std::int64_t at = fill[static_cast<std::size_t>(slot[static_cast<std::size_t>(q)])]++;
      perm[static_cast<std::size_t>(at)] = q;
      std::memcpy(xg.as<float>() + at * H, rb + q * win, static_cast<std::size_t>(H) * 4);
      if (p.backward) {
        std::memcpy(dyg.as<float>() + at * H, rb + q * win + H, static_cast<std::size_t>(H) * 4);
        wg[static_cast<std::size_t>(at)] = rb[q * win + 2 * H];
      }
    }
    // d. Expert FFNs, one contiguous segment per slot.
    for (std::int64_t sl = 0; sl < slots; ++sl) {
      const std::int64_t a = slot_rows[static_cast<std::size_t>(sl)], m = slot_rows[static_cast<std::size_t>(sl + 1)] - a;
      if (m == 0) continue;
      const float* W = weights_of(sl);
      const float *Wg = W, *Wu = W + F * H, *Wd = W + 2 * F * H;
      const float* X = xg.as<float>() + a * H;
      float *G = gate.as<float>() + a * F, *U = up.as<float>() + a * F, *A = act.as<float>() + a * F;
      float* O = outg.as<float>() + a * H;
      cpu::gemm_f32(false, true, m, F, H, 1.0f, X, H, Wg, H, 0.0f, G, F);
      cpu::gemm_f32(false, true, m, F, H, 1.0f, X, H, Wu, H, 0.0f, U, F);
      cpu::swiglu_forward(A, G, U, m * F);
      cpu::gemm_f32(false, true, m, H, F, 1.0f, A, F, Wd, F, 0.0f, O, H);
      if (!p.backward) continue;
      // dw = dy . out; dout = w dy (in place over dy); then the FFN's backward.
      float* DY = dyg.as<float>() + a * H;
      for (std::int64_t q = 0; q < m; ++q) {
        double dot = 0;
        for (std::int64_t k = 0; k < H; ++k) dot += static_cast<double>(DY[q * H + k]) * O[q * H + k];
        dwg[static_cast<std::size_t>(a + q)] = static_cast<float>(dot);
        const float wq = wg[static_cast<std::size_t>(a + q)];
        for (std::int64_t k = 0; k < H; ++k) DY[q * H + k] *= wq;
      }
      float* dW = grads_of(sl);
      float *dWg = dW, *dWu = dW + F * H, *dWd = dW + 2 * F * H;
      cpu::gemm_f32(true, false, H, F, m, 1.0f, DY, H, A, F, 1.0f, dWd, F);          // dWd += dout^T act
      cpu::gemm_f32(false, false, m, F, H, 1.0f, DY, H, Wd, F, 0.0f, A, F);          // dact = dout Wd
      cpu::swiglu_backward(G, U, A, G, U, m * F);                                     // -> dgate, dup
      cpu::gemm_f32(true, false, F, H, m, 1.0f, G, F, X, H, 1.0f, dWg, H);            // dWg += dgate^T x
      cpu::gemm_f32(true, false, F, H, m, 1.0f, U, F, X, H, 1.0f, dWu, H);            // dWu += dup^T x
      cpu::gemm_f32(false, false, m, H, F, 1.0f, G, F, Wg, H, 0.0f, O, H);            // dx = dgate Wg
      cpu::gemm_f32(false, false, m, H, F, 1.0f, U, F, Wu, H, 1.0f, O, H);            //    + dup Wu
    }

    // Results back into arrival order, ready to go home.
    float* ob = outbuf[i % nbuf].as<float>();
    for (std::int64_t at = 0; at < n; ++at) {
      const std::int64_t q = perm[static_cast<std::size_t>(at)];
      std::memcpy(ob + q * wout, outg.as<float>() + at * H, static_cast<std::size_t>(H) * 4);
      if (p.backward) ob[q * wout + H] = dwg[static_cast<std::size_t>(at)];
    }
  };

  // c. Combine at the source.
  auto unpack = [&](int i) {
    const float* bb = backbuf[i % nbuf].as<float>();
    std::int64_t row = 0;
    for (int d = 0; d < P; ++d) {
      const auto& list = to[static_cast<std::size_t>(d)];
      for (std::int64_t j = plan.slice_begin(r, d, i); j < plan.slice_begin(r, d, i + 1); ++j, ++row) {
        const std::int64_t c = list[static_cast<std::size_t>(j)], t = c / K;
        const float* src = bb + row * wout;
        if (p.backward) {
          float* dxt = p.dx + t * H;
          for (std::int64_t k = 0; k < H; ++k) dxt[k] += src[k];
          p.dw[c] = src[H];
        } else {
          float* yt = p.y + t * H;
          const float wc = p.w[c];
          for (std::int64_t k = 0; k < H; ++k) yt[k] += wc * src[k];
        }
      }
    }
  };

  if (!overlap) {
    for (int i = 0; i < plan.rounds; ++i) {
      pack(i);
      dispatch(i);
      compute(i);
      combine(i);
      unpack(i);
    }
  } else {
    // Every rank submits the same collectives in the same order to its communication
    // thread, which is the only thread calling the communicator until the loop ends.
    CpuStream comm_thread("moe-comm", CpuStream::Mode::worker_thread);
    std::vector<Event> dispatched(static_cast<std::size_t>(plan.rounds)), combined(static_cast<std::size_t>(plan.rounds));
    auto submit = [&](std::vector<Event>& done, int i, bool is_combine) {
      comm_thread.submit([&, i, is_combine] { is_combine ? combine(i) : dispatch(i); });
      done[static_cast<std::size_t>(i)] = comm_thread.record();
    };
    pack(0);
    submit(dispatched, 0, false);
    for (int i = 0; i < plan.rounds; ++i) {
      if (i + 1 < plan.rounds) {
        pack(i + 1);  // its buffer's previous dispatch (round i-1) has completed
        submit(dispatched, i + 1, false);
      }
      dispatched[static_cast<std::size_t>(i)].synchronize();
      comm_thread.rethrow_failure();
      compute(i);
      if (i > 0) {
        combined[static_cast<std::size_t>(i - 1)].synchronize();
        comm_thread.rethrow_failure();
        unpack(i - 1);
      }
      submit(combined, i, true);
    }
    comm_thread.synchronize();
    unpack(plan.rounds - 1);
  }

  // 5. Helpers' weight gradients return to the owners once, summed there.
  if (p.backward && !plan.spills.empty()) {
    Buffer back = dev_.allocate(Component::dispatch, static_cast<std::uint64_t>(lent.size()) * static_cast<std::uint64_t>(EF) * 4);
    g_.all_to_all_v(fgrads.data(), wrc, prefix(wrc), back.data(), wsc, prefix(wsc), DType::f32);
    for (std::size_t i = 0; i < lent.size(); ++i) {
      float* dst = p.dparams + (lent[i] - r * plan.local) * EF;
      const float* src = back.as<float>() + static_cast<std::int64_t>(i) * EF;
      for (std::int64_t k = 0; k < EF; ++k) dst[k] += src[k];
    }
  }

  stats_.rounds = plan.rounds;
  stats_.spilled = plan.spilled;
  stats_.imbalance = plan.imbalance;
  stats_.spills = static_cast<std::int64_t>(plan.spills.size());
  stats_.max_received_rows = mr;
  stats_.foreign_experts = nf;
}

}  // namespace peakbound
