// One forward or backward pass of MoeDispatch (moe_dispatch.h), as an object whose
// methods are its stages, in the order run() calls them:
//   plan     the routing every rank derives from the gathered counts: this rank's copies
//            per destination and the copies it receives from every source;
//   lend     the weights of the experts this rank helps with, sent once by their owners;
//   keep     forward: the store of the experts' intermediates when the caller keeps them
//            (Io::kept); backward: the store the forward filled, checked against the plan;
//   rounds   the round buffers; then per round: stage (pack this rank's rows), exchange
//            (all-to-all), compute (this rank's experts on the received rows), exchange
//            back, combine (at the source, token by token). Serial, or pipelined with the
//            exchanges on the communication stream;
//   return   backward: the helpers' weight gradients go back to the owners once.
// Forward and backward share every stage; the mode decides what a row carries ([x]
// forward, [x | dy | gate weight] backward) and whether the experts run backward too.
// Every device buffer comes from dispatch_buffers (moe_footprint.h), in the order the
// footprint's phases assume.
#include <algorithm>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/nn/swiglu_ffn.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/moe_permute.h"
#include "peakbound/schedules/moe_dispatch.h"

namespace peakbound {

namespace {

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

// On any exit by exception, no host task of the communication stream may outlive the
// buffers and lists it refers to.
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
};

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

}  // namespace

// A = float | bf16, the activation type: the rows, the grouped rows, gate/up/act and
// the expert weights are A; routing weights, their gradients and expert weight
// gradients are fp32 in both.
template <class A>
class MoeDispatch::Pass {
  static constexpr bool kBf16 = std::is_same_v<A, bf16>;
  static constexpr Precision kPrecision = kBf16 ? Precision::bf16 : Precision::f32;
  static constexpr DType kRows = kBf16 ? DType::bf16 : DType::f32;  // the rows' and lent weights' dtype

 public:
  Pass(MoeDispatch& d, const Io<A>& io)
      : dev_(d.dev_), g_(d.g_), s_(d.s_), kind_(d.kind_), options_(d.options_), comm_(*d.comm_), io_(io),
        backward_(io.backward), cs_(d.dev_.compute_stream()), P_(d.g_.size()), r_(d.g_.rank()), H_(d.s_.hidden),
        F_(d.s_.ffn), E_(d.s_.experts), K_(d.s_.top_k), T_(io.tokens), EF_(d.s_.expert_floats()) {}

  void run() {
    plan();
    keep();
    lend();
    allocate_rounds();
    // Every round's combine adds into the output: a token's copies may come home in different rounds.
    if (T_) ops::fill(dev_, cs_, backward_ ? io_.dx : io_.y, T_ * H_, 0.0f);
    if (sizes_.double_buffered)
      run_pipelined();
    else
      run_serial();
    if (backward_) return_grads();
    dev_.synchronize(cs_);
  }

  DispatchStats stats() const {
    DispatchStats st;
    st.rounds = plan_.rounds;
    st.round_cap = plan_.round_cap;
    st.spilled = plan_.spilled;
    st.imbalance = plan_.imbalance;
    st.spills = static_cast<std::int64_t>(plan_.spills.size());
    st.max_received_rows = sizes_.max_received;
    st.foreign_experts = static_cast<std::int64_t>(foreign_.size());
    st.sizes = sizes_;
    return st;
  }

 private:
  // ---- plan: the routing, the same on every rank ----

  // Counts per (source, expert), gathered so every rank derives the same plan. The router
  // wrote the expert ids on the device; the plan is made on the host. Returns this rank's
  // copies (token * K + k) of every expert, in local order.
  std::vector<std::vector<std::int64_t>> gather_plan() {
    std::vector<std::int32_t> ids(at(T_ * K_));
    copy_to_host(dev_, ids.data(), io_.ids, ids.size() * sizeof(std::int32_t));
    std::int64_t bad = -1;
    std::vector<std::vector<std::int64_t>> by_expert(at(E_));
    for (std::int64_t c = 0; c < T_ * K_; ++c) {
      std::int32_t e = ids[at(c)];
      if (e < 0 || e >= E_) {
        bad = c;
        break;
      }
      by_expert[at(e)].push_back(c);
    }
    std::int64_t any_bad = bad >= 0;
    g_.all_reduce(&any_bad, 1, DType::i64, ReduceOp::max);
    if (bad >= 0)
      throw InvalidArgument("moe dispatch: expert id " + std::to_string(ids[at(bad)]) + " of token " +
                            std::to_string(bad / K_) + " is outside [0, " + std::to_string(E_) + ")");
    if (any_bad) throw InvalidArgument("moe dispatch: an expert id on another rank is out of range");
    std::vector<std::int64_t> mine(at(E_)), all(at(P_ * E_));
    for (std::int64_t e = 0; e < E_; ++e) mine[at(e)] = static_cast<std::int64_t>(by_expert[at(e)].size());
    g_.all_gather(mine.data(), all.data(), at(E_), DType::i64);
    plan_ = dispatch_plan(kind_, s_, P_, all, options_, kPrecision);
    return by_expert;
  }

  void plan() {
    const std::vector<std::vector<std::int64_t>> by_expert = gather_plan();
    // This rank's copies per destination, in (expert, local order) order.
    to_.resize(at(P_));
    for (std::int64_t e = 0; e < E_; ++e) {
      const auto& cs_e = by_expert[at(e)];
      std::int64_t g0 = 0;
      for (int q = 0; q < r_; ++q) g0 += plan_.count(q, e);
      const auto& pcs = plan_.pieces[at(e)];
      std::size_t pi = 0;
      for (std::size_t j = 0; j < cs_e.size(); ++j) {
        const std::int64_t g = g0 + static_cast<std::int64_t>(j);
        while (pcs[pi].end <= g) ++pi;
        to_[at(pcs[pi].dest)].push_back(cs_e[j]);
      }
    }
    // from_[q * E + e]: copies of expert e that source q sends this rank over the pass. A
    // source's block to d is in expert order, so with the round slices these give the
    // expert of every received row without reading the rows.
    from_.assign(at(P_ * E_), 0);
    for (std::int64_t e = 0; e < E_; ++e) {
      std::int64_t g0 = 0;
      for (int q = 0; q < P_; ++q) {
        const std::int64_t g1 = g0 + plan_.count(q, e);
        for (const MoePlan::Piece& pc : plan_.pieces[at(e)])
          if (pc.dest == r_)
            from_[at(q * E_ + e)] += std::max<std::int64_t>(0, std::min(g1, pc.end) - std::max(g0, pc.begin));
        g0 = g1;
      }
    }
    // Every device buffer of this pass comes from its footprint's specs.
    sizes_ = dispatch_sizes(plan_, r_, T_);
    bufs_ = dispatch_buffers(s_, sizes_, backward_ ? DispatchPass::backward : DispatchPass::forward, kPrecision);
  }

  Buffer alloc(const BufferSpec& b) { return dev_.allocate(b.component, b.bytes); }

  // ---- keep: the experts' gate, up, act and out of every row this rank computes ----
  // Four planes of the pass's rows (round by round, each round's rows grouped by slot as
  // compute() groups them): gate, up, act [N, F], out [N, H]. The backward's plan is the
  // forward's (the same routing), so its rounds and their rows are the same.
  void keep() {
    round_first_.assign(at(plan_.rounds) + 1, 0);
    for (int i = 0; i < plan_.rounds; ++i) round_first_[at(i) + 1] = round_first_[at(i)] + plan_.received(r_, i);
    if (io_.kept == nullptr) return;
    const BufferSpec spec = dispatch_kept_buffer(s_, sizes_.computed, kPrecision);
    PB_CHECK(round_first_.back() == sizes_.computed);
    if (backward_) {
      if (io_.kept->bytes() != spec.reserved())
        throw InternalError("moe dispatch: the kept experts hold " + std::to_string(io_.kept->bytes()) +
                            " bytes where this backward's plan computes " + std::to_string(sizes_.computed) +
                            " rows (" + std::to_string(spec.reserved()) + " bytes): not the forward's routing");
    } else {
      *io_.kept = alloc(spec);
    }
    kept_ = io_.kept->bytes() > 0 ? io_.kept->template as<A>() : nullptr;
    kept_rows_ = dispatch_kept_rows(s_, sizes_.computed, kPrecision);  // the planes' stride
  }

  // ---- lend: weights of the experts this rank helps with, sent once by their owners ----
  // (in the weights' dtype A; their gradients stay fp32 and go back as f32)

  void lend() {
    foreign_ = plan_.foreign_experts(r_);
    const std::int64_t nf = static_cast<std::int64_t>(foreign_.size());
    fweights_ = alloc(bufs_.foreign_weights);
    fgrads_ = alloc(bufs_.foreign_grads);
    if (backward_ && nf) ops::fill(dev_, cs_, fgrads_.as<float>(), nf * EF_, 0.0f);
    wsc_.assign(at(P_), 0);
    wrc_.assign(at(P_), 0);
    for (int d = 0; d < P_; ++d)
      for (const auto& sp : plan_.spills)
        if (sp.owner == r_ && sp.helper == d) {
          lent_.push_back(sp.expert - r_ * plan_.local);
          wsc_[at(d)] += at(EF_);
        }
    for (const auto& sp : plan_.spills)
      if (sp.helper == r_) wrc_[at(sp.owner)] += at(EF_);
    if (plan_.spills.empty()) return;
    // The staging is freed before the rounds' buffers are taken.
    Buffer wsend = alloc(bufs_.lend_send), windex = alloc(bufs_.lend_index);
    dev_.memcpy_async(windex.data(), lent_.data(), lent_.size() * sizeof(std::int64_t), CopyKind::host_to_device, cs_);
    ops::moe_gather_rows(dev_, cs_, wsend.as<A>(), io_.params, windex.as<std::int64_t>(),
                         static_cast<std::int64_t>(lent_.size()), EF_);
    dev_.synchronize(cs_);
    g_.all_to_all_v(wsend.data(), wsc_, packed_displs(wsc_), fweights_.data(), wrc_, packed_displs(wrc_), kRows);
  }

  // The expert slot of expert e on this rank: its own experts, then the lent ones.
  std::int64_t slot_of(std::int64_t e) const {
    if (plan_.owner(e) == r_) return e - r_ * plan_.local;
    auto it = std::lower_bound(foreign_.begin(), foreign_.end(), e);
    PB_CHECK_MSG(it != foreign_.end() && *it == e, "row for an expert this rank neither owns nor helps with");
    return plan_.local + (it - foreign_.begin());
  }
  const A* weights_of(std::int64_t slot) const {
    return slot < plan_.local ? io_.params + slot * EF_ : fweights_.as<A>() + (slot - plan_.local) * EF_;
  }
  float* grads_of(std::int64_t slot) const {
    return slot < plan_.local ? io_.dparams + slot * EF_ : fgrads_.as<float>() + (slot - plan_.local) * EF_;
  }

  // ---- rounds: buffers sized once for the largest round and reused ----

  // Pipelined rounds double-buffer the exchange so round i+1's dispatch and round i-1's
  // combine run on the communication stream while round i's experts compute.
  void allocate_rounds() {
    win_ = ops::moe_send_width(H_, backward_, kRows);     // x [, dy, w]
    wout_ = ops::moe_result_width(H_, backward_, kRows);  // dx, dw | out
    mr_ = sizes_.max_received;
    ms_ = sizes_.max_sent;
    nbuf_ = bufs_.exchange_copies;
    for (int b = 0; b < nbuf_; ++b) {
      send_[b] = alloc(bufs_.send);
      recv_[b] = alloc(bufs_.recv);
      back_[b] = alloc(bufs_.back);
      out_[b] = alloc(bufs_.out);
      idx_[b] = alloc(bufs_.indices);
    }
    xg_ = alloc(bufs_.x_grouped), dyg_ = alloc(bufs_.dy_grouped), gw_ = alloc(bufs_.gate_weights);
    gate_ = alloc(bufs_.gate), up_ = alloc(bufs_.up), act_ = alloc(bufs_.act), tile_ = alloc(bufs_.expert_tile);
    outg_ = alloc(bufs_.out_grouped);
    wg_ = backward_ ? gw_.as<float>() : nullptr;  // grouped gate weights [mr], then their gradients [mr]
    dwg_ = backward_ ? gw_.as<float>() + mr_ : nullptr;
    at_perm_ = ms_, at_unpack_ = ms_ + mr_, at_order_ = 2 * ms_ + mr_, at_starts_ = 3 * ms_ + mr_;
    for (int b = 0; b < nbuf_; ++b) host_idx_[b].resize(at(4 * ms_ + mr_ + 1));
    slot_rows_.resize(at(plan_.local + static_cast<std::int64_t>(foreign_.size()) + 1));
    round_slot_.resize(at(mr_));
  }

  void run_serial() {
    for (int i = 0; i < plan_.rounds; ++i) {
      stage(i);
      dev_.synchronize(cs_);
      exchange(i, false);
      compute(i);
      dev_.synchronize(cs_);
      exchange(i, true);
      combine(i);
    }
  }

  // Every rank submits the same collectives in the same order to its communication
  // stream, whose thread is the only one calling the communicator until the loop ends.
  void run_pipelined() {
    CommFailure failure;
    Drain drain{dev_, comm_, failure};
    std::vector<Event> dispatched(at(plan_.rounds)), combined(at(plan_.rounds));
    // The compute thread's waits for the exchanges are the pass's exposed communication.
    auto await = [&](const Event& e) {
      {
        const CommunicationScope exposed;
        e.synchronize();
      }
      failure.rethrow();
    };
    stage(0);
    dispatched[0] = submit(0, false, failure);
    for (int i = 0; i < plan_.rounds; ++i) {
      if (i + 1 < plan_.rounds) {
        stage(i + 1);  // its buffer's previous dispatch (round i-1) has completed
        dispatched[at(i + 1)] = submit(i + 1, false, failure);
      }
      await(dispatched[at(i)]);
      compute(i);
      if (i > 0) {
        await(combined[at(i - 1)]);
        combine(i - 1);
      }
      combined[at(i)] = submit(i, true, failure);
    }
    {
      const CommunicationScope exposed;
      dev_.synchronize(comm_);
    }
    failure.rethrow();
    combine(plan_.rounds - 1);
  }

  // Round i's exchange (back: the combine's) on the communication stream, after the
  // compute stream's work so far; returns the event of its completion.
  Event submit(int i, bool back, CommFailure& failure) {
    dev_.wait(comm_, dev_.record(cs_));  // the packed or computed rows are ready
    if (g_.enqueues_on_streams()) {
      // NCCL: the exchange goes on the communication stream itself (a CUDA host task may
      // not call NCCL); an enqueue failure throws here, an asynchronous one at the
      // stream's synchronize.
      const int b = i % nbuf_;
      auto [sc, rc] = counts(i, back);
      if (back)
        g_.all_to_all_v_on(dev_, comm_, out_[b].data(), sc, packed_displs(sc), back_[b].data(), rc, packed_displs(rc), kRows);
      else
        g_.all_to_all_v_on(dev_, comm_, send_[b].data(), sc, packed_displs(sc), recv_[b].data(), rc, packed_displs(rc), kRows);
      return dev_.record(comm_);
    }
    dev_.host_task(comm_, [this, i, back, &failure] {
      if (failure.failed()) return;
      try {
        exchange(i, back);
      } catch (...) {
        failure.set(std::current_exception());
      }
    });
    return dev_.record(comm_);
  }

  // Per-round counts (elements of the rows' dtype) of the dispatch, or of the combine (back).
  std::pair<std::vector<std::size_t>, std::vector<std::size_t>> counts(int i, bool back) const {
    std::vector<std::size_t> sc(at(P_)), rc(at(P_));
    for (int d = 0; d < P_; ++d) {
      sc[at(d)] = at(back ? plan_.slice(d, r_, i) * wout_ : plan_.slice(r_, d, i) * win_);
      rc[at(d)] = at(back ? plan_.slice(r_, d, i) * wout_ : plan_.slice(d, r_, i) * win_);
    }
    return {sc, rc};
  }

  // ---- one round: stage, exchange, compute, exchange back, combine ----

  // The round's host indices staged into idx_[b] at `offset` (same layout as host_idx_[b]): the
  // copies packed [ms] | the grouping permutation [mr] | the copies unpacked [ms], their
  // order by token [ms] and its segment starts [ms + 1]. A host region is rebuilt only
  // after the copy that staged it last has completed (the same round's exchange has).
  const std::int64_t* stage_indices(int b, std::int64_t offset, std::int64_t n) {
    std::int64_t* dst = idx_[b].as<std::int64_t>() + offset;
    dev_.memcpy_async(dst, host_idx_[b].data() + offset, static_cast<std::uint64_t>(n) * sizeof(std::int64_t),
                      CopyKind::host_to_device, cs_);
    return dst;
  }

  // This round's slice of every (this rank, d) block, in send order, into dst; returns its length.
  std::int64_t round_copies(int i, std::int64_t* dst) const {
    std::int64_t n = 0;
    for (int d = 0; d < P_; ++d) {
      const auto& list = to_[at(d)];
      for (std::int64_t j = plan_.slice_begin(r_, d, i); j < plan_.slice_begin(r_, d, i + 1); ++j)
        dst[n++] = list[at(j)];
    }
    PB_CHECK(n <= ms_);
    return n;
  }

  // Pack this round's slice of every (this rank, d) block into the send buffer.
  void stage(int i) {
    const int b = i % nbuf_;
    const std::int64_t n = round_copies(i, host_idx_[b].data());
    ops::moe_pack_rows(dev_, cs_, send_[b].as<A>(), win_, stage_indices(b, 0, n), n, K_, H_, io_.x,
                       backward_ ? io_.dy : nullptr, io_.w);
  }

  // The round's all-to-all: packed rows to the experts' ranks, or (back) results home.
  void exchange(int i, bool back) {
    const int b = i % nbuf_;
    auto [sc, rc] = counts(i, back);
    if (back)
      g_.all_to_all_v(out_[b].data(), sc, packed_displs(sc), back_[b].data(), rc, packed_displs(rc), kRows);
    else
      g_.all_to_all_v(send_[b].data(), sc, packed_displs(sc), recv_[b].data(), rc, packed_displs(rc), kRows);
  }

  // The expert slot of every received row (sources in rank order, each source's slice in
  // expert order) into round_slot_, then the rows grouped by slot (counting sort, stable):
  // slot_rows_ their segment starts, the permutation into host_idx_[b]. Returns the rows.
  std::int64_t group_by_slot(int i, int b) {
    const std::int64_t n = plan_.received(r_, i);
    std::int64_t q = 0;
    for (int src = 0; src < P_; ++src) {
      const std::int64_t a = plan_.slice_begin(src, r_, i), z = plan_.slice_begin(src, r_, i + 1);
      std::int64_t pos = 0;  // where expert e's rows start in the source's block
      for (std::int64_t e = 0; e < E_ && pos < z; ++e) {
        const std::int64_t k = from_[at(src * E_ + e)];
        const std::int64_t lo = std::max(a, pos), hi = std::min(z, pos + k);
        if (hi > lo) {
          const std::int64_t sl = slot_of(e);
          PB_CHECK(q + (hi - lo) <= n);
          for (std::int64_t j = lo; j < hi; ++j) round_slot_[at(q++)] = sl;
        }
        pos += k;
      }
    }
    PB_CHECK_MSG(q == n, "moe dispatch: the plan's received rows do not match its slices");
    std::fill(slot_rows_.begin(), slot_rows_.end(), 0);
    for (std::int64_t j = 0; j < n; ++j) ++slot_rows_[at(round_slot_[at(j)] + 1)];
    std::partial_sum(slot_rows_.begin(), slot_rows_.end(), slot_rows_.begin());
    std::vector<std::int64_t> fill(slot_rows_.begin(), slot_rows_.end() - 1);
    std::int64_t* perm = host_idx_[b].data() + at_perm_;
    for (std::int64_t j = 0; j < n; ++j) perm[fill[at(round_slot_[at(j)])]++] = j;
    return n;
  }

  // The experts of this rank on one round's received rows: grouped by slot, one FFN per
  // contiguous segment, the results back into arrival order, ready to go home.
  void compute(int i) {
    const int b = i % nbuf_;
    const std::int64_t n = group_by_slot(i, b);
    const std::int64_t* dperm = stage_indices(b, at_perm_, n);
    ops::moe_group_rows(dev_, cs_, xg_.as<A>(), backward_ ? dyg_.as<A>() : nullptr, wg_, recv_[b].as<A>(), win_,
                        dperm, n, H_);
    const std::int64_t first = round_first_[at(i)];
    for (std::size_t sl = 0; sl + 1 < slot_rows_.size(); ++sl) {
      const std::int64_t a = slot_rows_[sl], m = slot_rows_[sl + 1] - a;
      if (m > 0) expert(static_cast<std::int64_t>(sl), a, m, first);
    }
    // The forward's out is in the kept store when it keeps (the backward's dx is in out_grouped).
    const A* results = kept_ != nullptr && !backward_ ? kept_plane(3) + first * H_ : outg_.as<A>();
    ops::moe_ungroup_rows(dev_, cs_, out_[b].as<A>(), wout_, results, dwg_, dperm, n, H_);
  }

  // Plane p of the kept store (0 gate, 1 up, 2 act [N, F]; 3 out [N, H]).
  A* kept_plane(int p) const { return kept_ + static_cast<std::int64_t>(p) * kept_rows_ * F_; }

  // Expert `slot` on grouped rows [a, a + m) of the round whose rows start at `first` of
  // the pass's: its output into out_grouped (keeping: gate, up, act and out into the
  // kept store's rows first + a...); backward also dw = dy . out, dout = w dy (in place
  // over dy), the FFN's backward with dx into out_grouped and the weight gradients added
  // into the slot's (fp32; bf16: the FFN's products through its fp32 tile, each stored
  // activation rounded once). The backward of a kept pass runs no forward: it reads the
  // kept gate, up, act and out (and spends them as the FFN backward's scratch).
  void expert(std::int64_t slot, std::int64_t a, std::int64_t m, std::int64_t first) {
    const PhaseScope phase(StepPhase::experts);
    const A* W = weights_of(slot);
    // [W_gate | W_up | W_down] (+ [b_gate | b_up | b_down]: gpt-oss)
    SwigluFfnWeightsOf<A> w{W, W + F_ * H_, W + 2 * F_ * H_};
    const A* B = W + 3 * F_ * H_;
    if (s_.bias) {
      w.b_gate = B;
      w.b_up = B + F_;
      w.b_down = B + 2 * F_;
    }
    if (s_.clamped) w.clamp = &s_.clamp;
    const A* X = xg_.as<A>() + a * H_;
    A *G = gate_.as<A>() + a * F_, *U = up_.as<A>() + a * F_, *Act = act_.as<A>() + a * F_;
    A* O = outg_.as<A>() + a * H_;
    if (kept_ != nullptr) {
      const std::int64_t row = first + a;
      G = kept_plane(0) + row * F_, U = kept_plane(1) + row * F_, Act = kept_plane(2) + row * F_;
      O = kept_plane(3) + row * H_;
    }
    if (kept_ == nullptr || !backward_) {
      if constexpr (kBf16)
        swiglu_ffn_forward(dev_, cs_, m, H_, F_, X, w, G, U, Act, O, false, tile_.as<float>());
      else
        swiglu_ffn_forward(dev_, cs_, m, H_, F_, X, w, G, U, Act, O, false);
    }
    if (!backward_) return;
    A* DY = dyg_.as<A>() + a * H_;
    ops::moe_dot_scale_rows(dev_, cs_, dwg_ + a, DY, O, wg_ + a, m, H_);
    float* dW = grads_of(slot);
    SwigluFfnGrads dw{dW, dW + F_ * H_, dW + 2 * F_ * H_};
    if (s_.bias) {
      float* dB = dW + 3 * F_ * H_;
      dw.b_gate = dB;
      dw.b_up = dB + F_;
      dw.b_down = dB + 2 * F_;
    }
    A* DX = outg_.as<A>() + a * H_;  // over O when O is the round's (read above)
    if constexpr (kBf16)
      swiglu_ffn_backward(dev_, cs_, m, H_, F_, X, w, DY, G, U, Act, dw, DX, false, tile_.as<float>());
    else
      swiglu_ffn_backward(dev_, cs_, m, H_, F_, X, w, DY, G, U, Act, dw, DX, false);
  }

  // Combine at the source, token by token (the rows of one token in arrival order):
  // forward adds w * out into y; backward writes dx and d gate weights.
  void combine(int i) {
    const int b = i % nbuf_;
    std::int64_t* copies = host_idx_[b].data() + at_unpack_;
    std::int64_t* order = host_idx_[b].data() + at_order_;
    std::int64_t* starts = host_idx_[b].data() + at_starts_;
    const std::int64_t n = round_copies(i, copies);
    std::iota(order, order + n, std::int64_t{0});
    std::stable_sort(order, order + n, [&](std::int64_t u, std::int64_t v) { return copies[u] / K_ < copies[v] / K_; });
    std::int64_t segments = 0;
    for (std::int64_t j = 0; j < n; ++j)
      if (j == 0 || copies[order[j]] / K_ != copies[order[j - 1]] / K_) starts[segments++] = j;
    starts[segments] = n;
    // One staging copy for the three adjacent regions (copies, order, starts).
    const std::int64_t* dcopies = stage_indices(b, at_unpack_, at_starts_ + segments + 1 - at_unpack_);
    ops::moe_unpack_rows(dev_, cs_, back_[b].as<A>(), wout_, dcopies, dcopies + (at_order_ - at_unpack_),
                         dcopies + (at_starts_ - at_unpack_), segments, K_, H_, backward_ ? nullptr : io_.y, io_.w,
                         backward_ ? io_.dx : nullptr, io_.dw);
  }

  // ---- return: helpers' weight gradients go back to the owners once, summed there ----

  void return_grads() {
    if (plan_.spills.empty()) return;
    Buffer back = alloc(bufs_.grad_return);
    dev_.synchronize(cs_);
    g_.all_to_all_v(fgrads_.data(), wrc_, packed_displs(wrc_), back.data(), wsc_, packed_displs(wsc_), DType::f32);
    for (std::size_t i = 0; i < lent_.size(); ++i)
      ops::axpy(dev_, cs_, io_.dparams + lent_[i] * EF_, back.as<float>() + static_cast<std::int64_t>(i) * EF_, EF_,
                1.0f);
  }

  // The dispatch and this pass's tensors.
  Device& dev_;
  Communicator& g_;
  const MoeShape& s_;
  const DispatchKind kind_;
  const DispatchOptions& options_;
  Stream& comm_;  // the communication thread: host tasks run the exchanges
  const Io<A>& io_;
  const bool backward_;
  Stream& cs_;
  const int P_, r_;
  const std::int64_t H_, F_, E_, K_, T_, EF_;

  // plan
  MoePlan plan_;
  std::vector<std::vector<std::int64_t>> to_;  // this rank's copies per destination
  std::vector<std::int64_t> from_;
  DispatchSizes sizes_;
  DispatchBuffers bufs_;

  // keep: where each round's rows start in the pass's [rounds + 1]; the kept store
  // (Io::kept) and its rows, null / 0 when the pass keeps nothing.
  std::vector<std::int64_t> round_first_;
  A* kept_ = nullptr;
  std::int64_t kept_rows_ = 0;

  // lend: foreign_ the experts this rank helps with (ascending); lent_ the local slots of
  // the experts it lends, grouped by helper ascending; their weight counts per rank.
  std::vector<std::int64_t> foreign_, lent_;
  std::vector<std::size_t> wsc_, wrc_;
  Buffer fweights_, fgrads_;

  // rounds: row widths in and out, the largest round's rows, the exchange copies.
  std::int64_t win_ = 0, wout_ = 0, mr_ = 0, ms_ = 0;
  int nbuf_ = 1;
  Buffer send_[2], recv_[2], back_[2], out_[2], idx_[2];
  Buffer xg_, dyg_, gw_, gate_, up_, act_, tile_, outg_;
  float* wg_ = nullptr;   // backward: grouped gate weights [mr]
  float* dwg_ = nullptr;  // backward: their gradients [mr]
  std::int64_t at_perm_ = 0, at_unpack_ = 0, at_order_ = 0, at_starts_ = 0;  // regions of host_idx_
  std::vector<std::int64_t> host_idx_[2];
  std::vector<std::int64_t> slot_rows_;   // a round's segment start of every slot [slots + 1]
  std::vector<std::int64_t> round_slot_;  // a round's slot of every received row [mr]
};

template <class A>
void MoeDispatch::run(const Io<A>& io) {
  const PhaseScope phase(StepPhase::dispatch);  // the FFNs inside are "experts" (Pass::expert)
  Pass<A> pass(*this, io);
  pass.run();
  stats_ = pass.stats();
}

template void MoeDispatch::run<float>(const Io<float>& io);
template void MoeDispatch::run<bf16>(const Io<bf16>& io);

}  // namespace peakbound
