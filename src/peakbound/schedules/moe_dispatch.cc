#include "peakbound/schedules/moe_dispatch.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/layers/swiglu_ffn.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/moe_permute.h"

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

MoeDispatch::MoeDispatch(Device& dev, Communicator& ep_group, MoeShape shape, DispatchKind kind, DispatchOptions options)
    : dev_(dev), g_(ep_group), s_(shape), kind_(kind), options_(options) {
  if (s_.hidden < 1 || s_.ffn < 1 || s_.experts < 1 || s_.top_k < 1)
    throw InvalidArgument("moe dispatch: hidden, ffn, experts and top-k must be positive");
  if (s_.top_k > s_.experts)
    throw InvalidArgument("moe dispatch: top-k " + std::to_string(s_.top_k) + " exceeds the " +
                          std::to_string(s_.experts) + " experts");
  if (s_.experts % g_.size() != 0)
    throw InvalidArgument("moe dispatch: the expert-parallel size " + std::to_string(g_.size()) +
                          " does not divide the " + std::to_string(s_.experts) + " experts");
  check_dispatch_options(options_);
  comm_ = &dev_.create_stream("moe-comm");
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

// The first failure of the communication thread's host tasks; later tasks are skipped.
struct CommFailure {
  std::mutex mu;
  std::exception_ptr e;
  bool failed() {
    std::lock_guard<std::mutex> lock(mu);
    return e != nullptr;
  }
  void set(std::exception_ptr x) {
    std::lock_guard<std::mutex> lock(mu);
    if (!e) e = std::move(x);
  }
  void rethrow() {
    std::exception_ptr x;
    {
      std::lock_guard<std::mutex> lock(mu);
      x = e;
    }
    if (x) std::rethrow_exception(x);
  }
};

}  // namespace

void MoeDispatch::run(Pass& p) {
  const int P = g_.size(), r = g_.rank();
  const std::int64_t H = s_.hidden, F = s_.ffn, E = s_.experts, K = s_.top_k, T = p.tokens;
  const std::int64_t EF = s_.expert_floats();
  Stream& cs = dev_.compute_stream();

  // 1. Counts per (source, expert), gathered so every rank derives the same plan. The
  //    router wrote the expert ids on the device; the plan is made on the host.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T * K));
  copy_to_host(dev_, ids.data(), p.ids, ids.size() * sizeof(std::int32_t));
  std::int64_t bad = -1;
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
  for (std::int64_t c = 0; c < T * K; ++c) {
    std::int32_t e = ids[static_cast<std::size_t>(c)];
    if (e < 0 || e >= E) {
      bad = c;
      break;
    }
    by_expert[static_cast<std::size_t>(e)].push_back(c);
  }
  std::int64_t any_bad = bad >= 0;
  g_.all_reduce(&any_bad, 1, DType::i64, ReduceOp::max);
  if (bad >= 0)
    throw InvalidArgument("moe dispatch: expert id " + std::to_string(ids[static_cast<std::size_t>(bad)]) + " of token " +
                          std::to_string(bad / K) + " is outside [0, " + std::to_string(E) + ")");
  if (any_bad) throw InvalidArgument("moe dispatch: an expert id on another rank is out of range");
  std::vector<std::int64_t> mine(static_cast<std::size_t>(E)), all(static_cast<std::size_t>(P * E));
  for (std::int64_t e = 0; e < E; ++e) mine[static_cast<std::size_t>(e)] = static_cast<std::int64_t>(by_expert[static_cast<std::size_t>(e)].size());
  g_.all_gather(mine.data(), all.data(), static_cast<std::size_t>(E), DType::i64);
  const MoePlan plan = dispatch_plan(kind_, s_, P, all, options_, sizeof(float));

  // 2. This rank's copies per destination, in (expert, local order) order.
  std::vector<std::vector<std::int64_t>> to(static_cast<std::size_t>(P));
  for (std::int64_t e = 0; e < E; ++e) {
    const auto& cs_e = by_expert[static_cast<std::size_t>(e)];
    std::int64_t g0 = 0;
    for (int q = 0; q < r; ++q) g0 += plan.count(q, e);
    const auto& pcs = plan.pieces[static_cast<std::size_t>(e)];
    std::size_t pi = 0;
    for (std::size_t j = 0; j < cs_e.size(); ++j) {
      const std::int64_t g = g0 + static_cast<std::int64_t>(j);
      while (pcs[pi].end <= g) ++pi;
      to[static_cast<std::size_t>(pcs[pi].dest)].push_back(cs_e[j]);
    }
  }

  // Every device buffer of this pass comes from its footprint's specs.
  const DispatchSizes sizes = dispatch_sizes(plan, r, T);
  const DispatchBuffers bufs =
      dispatch_buffers(s_, sizes, p.backward ? DispatchPass::backward : DispatchPass::forward, sizeof(float));
  auto alloc = [&](const BufferSpec& b) { return dev_.allocate(b.component, b.bytes); };

  // 3. Weights of the experts this rank helps with, sent once by their owners.
  const std::vector<std::int64_t> foreign = plan.foreign_experts(r);
  const std::int64_t nf = static_cast<std::int64_t>(foreign.size());
  Buffer fweights = alloc(bufs.foreign_weights);
  Buffer fgrads = alloc(bufs.foreign_grads);
  if (p.backward && nf) ops::fill(dev_, cs, fgrads.as<float>(), nf * EF, 0.0f);
  std::vector<std::size_t> wsc(static_cast<std::size_t>(P), 0), wrc(static_cast<std::size_t>(P), 0);
  std::vector<std::int64_t> lent;  // local slots of the experts this rank lends, grouped by helper ascending
  for (int d = 0; d < P; ++d)
    for (const auto& sp : plan.spills)
      if (sp.owner == r && sp.helper == d) {
        lent.push_back(sp.expert - r * plan.local);
        wsc[static_cast<std::size_t>(d)] += static_cast<std::size_t>(EF);
      }
  for (const auto& sp : plan.spills)
    if (sp.helper == r) wrc[static_cast<std::size_t>(sp.owner)] += static_cast<std::size_t>(EF);
  if (!plan.spills.empty()) {
    Buffer wsend = alloc(bufs.lend_send), windex = alloc(bufs.lend_index);
    dev_.memcpy_async(windex.data(), lent.data(), lent.size() * sizeof(std::int64_t), CopyKind::host_to_device, cs);
    ops::moe_gather_rows(dev_, cs, wsend.as<float>(), p.params, windex.as<std::int64_t>(),
                         static_cast<std::int64_t>(lent.size()), EF);
    dev_.synchronize(cs);
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
  //    the communication stream while round i's experts compute.
  const std::int64_t win = p.backward ? 2 * H + 1 : H;  // x [, dy, w]
  const std::int64_t wout = p.backward ? H + 1 : H;          // dx, dw | out
  const std::int64_t mr = sizes.max_received;
  const bool overlap = sizes.double_buffered;
  const int nbuf = bufs.exchange_copies;
  Buffer sendbuf[2], recvbuf[2], backbuf[2], outbuf[2], idxbuf[2];
  for (int b = 0; b < nbuf; ++b) {
    sendbuf[b] = alloc(bufs.send);
    recvbuf[b] = alloc(bufs.recv);
    backbuf[b] = alloc(bufs.back);
    outbuf[b] = alloc(bufs.out);
    idxbuf[b] = alloc(bufs.indices);
  }
  Buffer xg = alloc(bufs.x_grouped), dyg = alloc(bufs.dy_grouped), gw = alloc(bufs.gate_weights),
         gate = alloc(bufs.gate), up = alloc(bufs.up), act = alloc(bufs.act), outg = alloc(bufs.out_grouped);
  float* wg = p.backward ? gw.as<float>() : nullptr;  // grouped gate weights [mr], then their gradients [mr]
  float* dwg = p.backward ? gw.as<float>() + mr : nullptr;
  // A round's indices, built on the host and staged into idxbuf[b] (same layout): the
  // copies packed [ms] | the grouping permutation [mr] | the copies unpacked [ms], their
  // order by token [ms] and its segment starts [ms + 1]. A host region is rebuilt only
  // after the copy that staged it last has completed (the same round's exchange has).
  const std::int64_t ms = sizes.max_sent;
  const std::int64_t at_perm = ms, at_unpack = ms + mr, at_order = 2 * ms + mr, at_starts = 3 * ms + mr;
  std::vector<std::int64_t> host_idx[2];
  for (int b = 0; b < nbuf; ++b) host_idx[b].resize(static_cast<std::size_t>(4 * ms + mr + 1));
  auto stage = [&](int b, std::int64_t at, std::int64_t n) {
    std::int64_t* dst = idxbuf[b].as<std::int64_t>() + at;
    dev_.memcpy_async(dst, host_idx[b].data() + at, static_cast<std::uint64_t>(n) * sizeof(std::int64_t),
                      CopyKind::host_to_device, cs);
    return static_cast<const std::int64_t*>(dst);
  };
  std::vector<std::int64_t> slot_rows(static_cast<std::size_t>(slots + 1));
  std::vector<std::int64_t> round_slot(static_cast<std::size_t>(mr));

  // from[q * E + e]: copies of expert e that source q sends this rank over the pass. A
  // source's block to d is in expert order, so with the round slices these give the
  // expert of every received row without reading the rows.
  std::vector<std::int64_t> from(static_cast<std::size_t>(P * E), 0);
  for (std::int64_t e = 0; e < E; ++e) {
    std::int64_t g0 = 0;
    for (int q = 0; q < P; ++q) {
      const std::int64_t g1 = g0 + plan.count(q, e);
      for (const MoePlan::Piece& pc : plan.pieces[static_cast<std::size_t>(e)])
        if (pc.dest == r) from[static_cast<std::size_t>(q * E + e)] += std::max<std::int64_t>(0, std::min(g1, pc.end) - std::max(g0, pc.begin));
      g0 = g1;
    }
  }

  if (T) ops::fill(dev_, cs, p.backward ? p.dx : p.y, T * H, 0.0f);

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
  // This round's slice of every (this rank, d) block, in send order, into dst; returns its length.
  auto round_copies = [&](int i, std::int64_t* dst) {
    std::int64_t n = 0;
    for (int d = 0; d < P; ++d) {
      const auto& list = to[static_cast<std::size_t>(d)];
      for (std::int64_t j = plan.slice_begin(r, d, i); j < plan.slice_begin(r, d, i + 1); ++j)
        dst[n++] = list[static_cast<std::size_t>(j)];
    }
    PB_CHECK(n <= ms);
    return n;
  };

  // a. Pack this round's slice of every (this rank, d) block.
  auto pack = [&](int i) {
    const int b = i % nbuf;
    const std::int64_t n = round_copies(i, host_idx[b].data());
    ops::moe_pack_rows(dev_, cs, sendbuf[b].as<float>(), win, stage(b, 0, n), n, K, H, p.x,
                       p.backward ? p.dy : nullptr, p.w);
  };

  // b. The experts of this rank on one round's received rows.
  auto compute = [&](int i) {
    const int b = i % nbuf;
    // The expert slot of every received row (sources in rank order, each source's slice
    // in expert order), then the rows grouped by slot (counting sort, stable).
    const std::int64_t n = plan.received(r, i);
    std::int64_t q = 0;
    for (int src = 0; src < P; ++src) {
      const std::int64_t a = plan.slice_begin(src, r, i), z = plan.slice_begin(src, r, i + 1);
      std::int64_t at = 0;
      for (std::int64_t e = 0; e < E && at < z; ++e) {
        const std::int64_t k = from[static_cast<std::size_t>(src * E + e)];
        const std::int64_t lo = std::max(a, at), hi = std::min(z, at + k);
        if (hi > lo) {
          const std::int64_t sl = slot_of(e);
          PB_CHECK(q + (hi - lo) <= n);
          for (std::int64_t j = lo; j < hi; ++j) round_slot[static_cast<std::size_t>(q++)] = sl;
        }
        at += k;
      }
    }
    PB_CHECK_MSG(q == n, "moe dispatch: the plan's received rows do not match its slices");
    std::fill(slot_rows.begin(), slot_rows.end(), 0);
    for (std::int64_t j = 0; j < n; ++j) ++slot_rows[static_cast<std::size_t>(round_slot[static_cast<std::size_t>(j)] + 1)];
    std::partial_sum(slot_rows.begin(), slot_rows.end(), slot_rows.begin());
    std::vector<std::int64_t> fill(slot_rows.begin(), slot_rows.end() - 1);
    std::int64_t* perm = host_idx[b].data() + at_perm;
    for (std::int64_t j = 0; j < n; ++j) perm[fill[static_cast<std::size_t>(round_slot[static_cast<std::size_t>(j)])]++] = j;
    const std::int64_t* dperm = stage(b, at_perm, n);
    const float* rb = recvbuf[b].as<float>();
    ops::moe_group_rows(dev_, cs, xg.as<float>(), p.backward ? dyg.as<float>() : nullptr, wg, rb, win, dperm, n, H);
    // Expert FFNs, one contiguous segment per slot.
    for (std::int64_t sl = 0; sl < slots; ++sl) {
      const std::int64_t a = slot_rows[static_cast<std::size_t>(sl)], m = slot_rows[static_cast<std::size_t>(sl + 1)] - a;
      if (m == 0) continue;
      const float* W = weights_of(sl);
      const SwigluFfnWeights w{W, W + F * H, W + 2 * F * H};  // [W_gate | W_up | W_down]
      const float* X = xg.as<float>() + a * H;
      float *G = gate.as<float>() + a * F, *U = up.as<float>() + a * F, *A = act.as<float>() + a * F;
      float* O = outg.as<float>() + a * H;
      swiglu_ffn_forward(dev_, cs, m, H, F, X, w, G, U, A, O, false);
      if (!p.backward) continue;
      // dw = dy . out; dout = w dy (in place over dy); then the FFN's backward, dx into O.
      float* DY = dyg.as<float>() + a * H;
      ops::moe_dot_scale_rows(dev_, cs, dwg + a, DY, O, wg + a, m, H);
      float* dW = grads_of(sl);
      swiglu_ffn_backward(dev_, cs, m, H, F, X, w, DY, G, U, A, SwigluFfnGrads{dW, dW + F * H, dW + 2 * F * H}, O,
                          false);
    }
    // Results back into arrival order, ready to go home.
    ops::moe_ungroup_rows(dev_, cs, outbuf[b].as<float>(), wout, outg.as<float>(), dwg, dperm, n, H);
  };

  // c. Combine at the source, token by token (the rows of one token in arrival order).
  auto unpack = [&](int i) {
    const int b = i % nbuf;
    std::int64_t* copies = host_idx[b].data() + at_unpack;
    std::int64_t* order = host_idx[b].data() + at_order;
    std::int64_t* starts = host_idx[b].data() + at_starts;
    const std::int64_t n = round_copies(i, copies);
    std::iota(order, order + n, std::int64_t{0});
    std::stable_sort(order, order + n, [&](std::int64_t u, std::int64_t v) { return copies[u] / K < copies[v] / K; });
    std::int64_t segments = 0;
    for (std::int64_t j = 0; j < n; ++j)
      if (j == 0 || copies[order[j]] / K != copies[order[j - 1]] / K) starts[segments++] = j;
    starts[segments] = n;
    // One staging copy for the three adjacent regions (copies, order, starts).
    const std::int64_t* dcopies = stage(b, at_unpack, at_starts + segments + 1 - at_unpack);
    ops::moe_unpack_rows(dev_, cs, backbuf[b].as<float>(), wout, dcopies, dcopies + (at_order - at_unpack),
                         dcopies + (at_starts - at_unpack), segments, K, H, p.backward ? nullptr : p.y, p.w,
                         p.backward ? p.dx : nullptr, p.dw);
  };

  if (!overlap) {
    for (int i = 0; i < plan.rounds; ++i) {
      pack(i);
      dev_.synchronize(cs);
      dispatch(i);
      compute(i);
      dev_.synchronize(cs);
      combine(i);
      unpack(i);
    }
  } else {
    // Every rank submits the same collectives in the same order to its communication
    // stream, whose thread is the only one calling the communicator until the loop ends.
    Stream& comm = *comm_;
    CommFailure failure;
    // On any exit, no host task may outlive the buffers and lists it refers to.
    struct Drain {
      Device& dev;
      Stream& comm;
      CommFailure& failure;
      ~Drain() {
        if (std::uncaught_exceptions() == 0) return;  // drained on the normal path
        failure.set(std::make_exception_ptr(InternalError("moe dispatch: pass abandoned")));
        try {
          dev.synchronize(comm);
        } catch (...) {
        }
      }
    } drain{dev_, comm, failure};
    std::vector<Event> dispatched(static_cast<std::size_t>(plan.rounds)), combined(static_cast<std::size_t>(plan.rounds));
    auto submit = [&](std::vector<Event>& done, int i, bool is_combine) {
      dev_.wait(comm, dev_.record(cs));  // the packed or computed rows are ready
      if (g_.enqueues_on_streams()) {
        // NCCL: the exchange goes on the communication stream itself (a CUDA host task
        // may not call NCCL); an enqueue failure throws here, an asynchronous one at
        // the stream's synchronize.
        const int b = i % nbuf;
        auto [sc, rc] = counts(i, is_combine);
        if (is_combine)
          g_.all_to_all_v_on(dev_, comm, outbuf[b].data(), sc, prefix(sc), backbuf[b].data(), rc, prefix(rc),
                             DType::f32);
        else
          g_.all_to_all_v_on(dev_, comm, sendbuf[b].data(), sc, prefix(sc), recvbuf[b].data(), rc, prefix(rc),
                             DType::f32);
        done[static_cast<std::size_t>(i)] = dev_.record(comm);
        return;
      }
      dev_.host_task(comm, [&, i, is_combine] {
        if (failure.failed()) return;
        try {
          is_combine ? combine(i) : dispatch(i);
        } catch (...) {
          failure.set(std::current_exception());
        }
      });
      done[static_cast<std::size_t>(i)] = dev_.record(comm);
    };
    auto await = [&](const Event& e) {
      e.synchronize();
      failure.rethrow();
    };
    pack(0);
    submit(dispatched, 0, false);
    for (int i = 0; i < plan.rounds; ++i) {
      if (i + 1 < plan.rounds) {
        pack(i + 1);  // its buffer's previous dispatch (round i-1) has completed
        submit(dispatched, i + 1, false);
      }
      await(dispatched[static_cast<std::size_t>(i)]);
      compute(i);
      if (i > 0) {
        await(combined[static_cast<std::size_t>(i - 1)]);
        unpack(i - 1);
      }
      submit(combined, i, true);
    }
    dev_.synchronize(comm);
    failure.rethrow();
    unpack(plan.rounds - 1);
  }

  // 5. Helpers' weight gradients return to the owners once, summed there.
  if (p.backward && !plan.spills.empty()) {
    Buffer back = alloc(bufs.grad_return);
    dev_.synchronize(cs);
    g_.all_to_all_v(fgrads.data(), wrc, prefix(wrc), back.data(), wsc, prefix(wsc), DType::f32);
    for (std::size_t i = 0; i < lent.size(); ++i)
      ops::axpy(dev_, cs, p.dparams + lent[i] * EF, back.as<float>() + static_cast<std::int64_t>(i) * EF, EF, 1.0f);
  }
  dev_.synchronize(cs);

  stats_.rounds = plan.rounds;
  stats_.round_cap = plan.round_cap;
  stats_.spilled = plan.spilled;
  stats_.imbalance = plan.imbalance;
  stats_.spills = static_cast<std::int64_t>(plan.spills.size());
  stats_.max_received_rows = mr;
  stats_.foreign_experts = nf;
  stats_.sizes = sizes;
}

}  // namespace peakbound
