// Ring-DTP: the vocabulary projection and cross-entropy with a peak independent of
// the total tokens. Either the weight shards or the token blocks circulate around the
// vocabulary group (whichever is smaller); at each hop a rank computes [chunk, V/P]
// logits blocks and folds them into an online log-sum-exp. Backward recomputes the
// blocks from the saved log-sum-exp: in weights mode dW accumulators travel with the
// shards (a ring reduce-scatter) and dX stays; in activations mode dX travels with the
// tokens and dW stays at the shard's owner. The next hop's transfer is posted before
// the current hop's compute and progressed between chunks, so it overlaps.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/cross_entropy.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

namespace {

constexpr int kTagW = 11, kTagAcc = 12, kTagH = 13, kTagT = 14, kTagStats = 15, kTagLse = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Non-blocking requests in flight; progress() lets MPI move them between chunks.
struct InFlight {
  std::vector<Request> reqs;
  void add(Request r) { reqs.push_back(std::move(r)); }
  void progress() {
    for (auto& r : reqs) r.test();
  }
  void wait() {
    for (auto& r : reqs) r.wait();
    reqs.clear();
  }
};

class RingDtp final : public VocabLoss {
 public:
  RingDtp(Device& dev, Communicator& g, const VocabLossOptions& o)
      : dev_(dev), g_(g), o_(o), P_(g.size()), r_(g.rank()), shard_(vocab_shard(o.vocab, P_, r_)) {}

  std::string name() const override { return "ring_dtp"; }
  std::string mode_used() const override { return std::string(ring_mode_name(mode_)); }

  LossSum forward(const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                  const float* weight) override {
    check_targets(g_, targets, tokens, o_);
    hidden_ = hidden;
    targets_ = targets;
    T_ = tokens;
    weight_ = weight;
    counts_ = gather_token_counts(g_, tokens);
    tmax_ = *std::max_element(counts_.begin(), counts_.end());
    rows_max_ = vocab_shard(o_.vocab, P_, 0).rows;  // shard 0 is never smaller
    mode_ = o_.mode;
    if (mode_ == RingMode::automatic) mode_ = tmax_ < rows_max_ ? RingMode::activations : RingMode::weights;
    chunk_ = std::max<std::int64_t>(1, o_.chunk);
    lse_ = alloc(T_);
    return mode_ == RingMode::weights ? forward_weights() : forward_activations();
  }

  void backward(float scale, float* d_hidden, float* d_weight) override {
    if (mode_ == RingMode::weights)
      backward_weights(scale, d_hidden, d_weight);
    else
      backward_activations(scale, d_hidden, d_weight);
    lse_.reset();
  }

 private:
  int next() const { return (r_ + 1) % P_; }
  int prev() const { return (r_ - 1 + P_) % P_; }
  int shard_at_hop(int hop) const { return ((r_ - hop) % P_ + P_) % P_; }
  Buffer alloc(std::int64_t floats) { return dev_.allocate(Component::vocab, static_cast<std::uint64_t>(floats) * 4); }

  // Logits of `n` token rows against a shard, into the block buffer.
  void logits(const float* h, std::int64_t n, const float* w, std::int64_t rows, float* block) const {
    cpu::gemm_f32(false, true, n, rows, o_.hidden, 1.0f, h, o_.hidden, w, o_.hidden, 0.0f, block, rows);
  }

  // ---- weights mode: shards travel, tokens stay ------------------------------------
  LossSum forward_weights() {
    const std::int64_t H = o_.hidden;
    Buffer stats = alloc(3 * T_);
    float *mx = stats.as<float>(), *sm = mx + T_, *tl = sm + T_;
    std::fill(mx, mx + T_, kNegInf);
    std::fill(sm, sm + T_, 0.0f);
    std::fill(tl, tl + T_, 0.0f);
    Buffer block = alloc(std::min(chunk_, T_) * rows_max_);
    Buffer ring[2];
    if (P_ > 1) ring[0] = alloc(rows_max_ * H), ring[1] = alloc(rows_max_ * H);
    const float* cur = weight_;
    for (int hop = 0; hop < P_; ++hop) {
      VocabShard sh = vocab_shard(o_.vocab, P_, shard_at_hop(hop));
      InFlight io;
      if (hop < P_ - 1) {
        VocabShard nx = vocab_shard(o_.vocab, P_, shard_at_hop(hop + 1));
        io.add(g_.irecv(ring[hop % 2].data(), static_cast<std::size_t>(nx.rows * H), DType::f32, prev(), kTagW));
        io.add(g_.isend(cur, static_cast<std::size_t>(sh.rows * H), DType::f32, next(), kTagW));
      }
      for (std::int64_t c0 = 0; c0 < T_ && sh.rows > 0; c0 += chunk_) {
        std::int64_t n = std::min(chunk_, T_ - c0);
        logits(hidden_ + c0 * H, n, cur, sh.rows, block.as<float>());
        cpu::lse_update(block.as<float>(), n, sh.rows, sh.rows, mx + c0, sm + c0);
        cpu::gather_target_logit(block.as<float>(), n, sh.rows, sh.rows, targets_ + c0, sh.offset, tl + c0);
        io.progress();
      }
      io.wait();
      if (hop < P_ - 1) cur = ring[hop % 2].as<float>();
    }
    LossSum out;
    out.loss = cpu::cross_entropy_finish(mx, sm, tl, targets_, T_, o_.ignore_index, o_.z_loss,
                                         lse_.as<float>(), &out.count);
    return out;
  }

  void backward_weights(float scale, float* d_hidden, float* d_weight) {
    const std::int64_t H = o_.hidden;
    if (T_ > 0) std::memset(d_hidden, 0, static_cast<std::size_t>(T_ * H) * 4);
    Buffer block = alloc(std::min(chunk_, T_) * rows_max_);
    Buffer wring[2], acc[2], partial;
    std::vector<Request> acc_send(2);
    if (P_ > 1) {
      wring[0] = alloc(rows_max_ * H), wring[1] = alloc(rows_max_ * H);
      acc[0] = alloc(rows_max_ * H), acc[1] = alloc(rows_max_ * H);
      partial = alloc(rows_max_ * H);
    }
    const float* cur = weight_;
    for (int hop = 0; hop < P_; ++hop) {
      VocabShard sh = vocab_shard(o_.vocab, P_, shard_at_hop(hop));
      const std::size_t n_sh = static_cast<std::size_t>(sh.rows * H);
      InFlight io;
      if (hop < P_ - 1) {
        VocabShard nx = vocab_shard(o_.vocab, P_, shard_at_hop(hop + 1));
        io.add(g_.irecv(wring[hop % 2].data(), static_cast<std::size_t>(nx.rows * H), DType::f32, prev(), kTagW));
        io.add(g_.isend(cur, n_sh, DType::f32, next(), kTagW));
      }
      // This shard's accumulator arrives from the ranks that processed it before us.
      float* slot = P_ > 1 ? acc[hop % 2].as<float>() : nullptr;
      Request acc_recv;
      if (hop > 0) {
        acc_send[hop % 2].wait();  // the slot's previous send must be done
        acc_recv = g_.irecv(slot, n_sh, DType::f32, prev(), kTagAcc);
      }
      // Our tokens' contribution to dW of this shard: straight into the slot at hop 0,
      // into `partial` later (added once the travelling accumulator is in).
      float* dw = P_ == 1 ? d_weight : (hop == 0 ? slot : partial.as<float>());
      const float beta0 = P_ == 1 ? 1.0f : 0.0f;
      if (sh.rows > 0 && T_ == 0 && P_ > 1) std::memset(dw, 0, n_sh * 4);
      for (std::int64_t c0 = 0; c0 < T_ && sh.rows > 0; c0 += chunk_) {
        std::int64_t n = std::min(chunk_, T_ - c0);
        float* G = block.as<float>();
        logits(hidden_ + c0 * H, n, cur, sh.rows, G);
        cpu::cross_entropy_grad(G, n, sh.rows, sh.rows, lse_.as<float>() + c0, targets_ + c0, sh.offset,
                                o_.ignore_index, o_.z_loss, scale);
        cpu::gemm_f32(true, false, sh.rows, H, n, 1.0f, G, sh.rows, hidden_ + c0 * H, H, c0 == 0 ? beta0 : 1.0f, dw, H);
        cpu::gemm_f32(false, false, n, H, sh.rows, 1.0f, G, sh.rows, cur, H, 1.0f, d_hidden + c0 * H, H);
        io.progress();
        acc_recv.test();
      }
      if (P_ > 1) {
        if (hop > 0) {
          acc_recv.wait();
          cpu::axpy(slot, partial.as<float>(), static_cast<std::int64_t>(n_sh), 1.0f);
        }
        // After the last hop this goes to the shard's owner (our next rank).
        acc_send[hop % 2] = g_.isend(slot, n_sh, DType::f32, next(), kTagAcc);
      }
      io.wait();
      if (hop < P_ - 1) cur = wring[hop % 2].as<float>();
    }
    if (P_ > 1) {
      // Our own shard's complete gradient comes back from the previous rank.
      int s = P_ % 2;
      acc_send[s].wait();
      g_.recv(acc[s].data(), static_cast<std::size_t>(shard_.rows * H), DType::f32, prev(), kTagAcc);
      cpu::axpy(d_weight, acc[s].as<float>(), shard_.rows * H, 1.0f);
      for (auto& r : acc_send) r.wait();
    }
  }

  // ---- activations mode: token blocks travel, shards stay -------------------------
  LossSum forward_activations() {
    const std::int64_t H = o_.hidden, rows = shard_.rows;
    Buffer block = alloc(std::min(chunk_, tmax_) * std::max<std::int64_t>(rows, 1));
    Buffer hring[2], tring[2], sring[2];
    std::vector<Request> stats_send(2);
    if (P_ > 1)
      for (int i = 0; i < 2; ++i) {
        hring[i] = alloc(tmax_ * H);
        tring[i] = alloc(tmax_);
        sring[i] = alloc(3 * tmax_);
      }
    Buffer part = alloc(3 * tmax_);  // this rank's partial stats for the current block
    const float* h = hidden_;
    const std::int32_t* t = targets_;
    for (int hop = 0; hop < P_; ++hop) {
      const int src = shard_at_hop(hop);
      const std::int64_t n = counts_[static_cast<std::size_t>(src)];
      InFlight io;
      if (hop < P_ - 1) {
        const std::int64_t nn = counts_[static_cast<std::size_t>(shard_at_hop(hop + 1))];
        io.add(g_.irecv(hring[hop % 2].data(), static_cast<std::size_t>(nn * H), DType::f32, prev(), kTagH));
        io.add(g_.irecv(tring[hop % 2].data(), static_cast<std::size_t>(nn), DType::i32, prev(), kTagT));
        io.add(g_.isend(h, static_cast<std::size_t>(n * H), DType::f32, next(), kTagH));
        io.add(g_.isend(t, static_cast<std::size_t>(n), DType::i32, next(), kTagT));
      }
      float *mx = part.as<float>(), *sm = mx + n, *tl = sm + n;
      std::fill(mx, mx + n, kNegInf);
      std::fill(sm, sm + n, 0.0f);
      std::fill(tl, tl + n, 0.0f);
      for (std::int64_t c0 = 0; c0 < n && rows > 0; c0 += chunk_) {
        std::int64_t m = std::min(chunk_, n - c0);
        logits(h + c0 * H, m, weight_, rows, block.as<float>());
        cpu::lse_update(block.as<float>(), m, rows, rows, mx + c0, sm + c0);
        cpu::gather_target_logit(block.as<float>(), m, rows, rows, t + c0, shard_.offset, tl + c0);
        io.progress();
      }
      if (P_ == 1) {
        LossSum out;
        out.loss = cpu::cross_entropy_finish(mx, sm, tl, targets_, T_, o_.ignore_index, o_.z_loss,
                                             lse_.as<float>(), &out.count);
        return out;
      }
      // Merge with the statistics the block brought from earlier ranks, pass them on.
      float* st = sring[hop % 2].as<float>();
      stats_send[hop % 2].wait();
      if (hop == 0) {
        std::memcpy(st, mx, static_cast<std::size_t>(3 * n) * 4);
      } else {
        g_.recv(st, static_cast<std::size_t>(3 * n), DType::f32, prev(), kTagStats);
        cpu::lse_merge(st, st + n, st + 2 * n, mx, sm, tl, n);
      }
      stats_send[hop % 2] = g_.isend(st, static_cast<std::size_t>(3 * n), DType::f32, next(), kTagStats);
      io.wait();
      if (hop < P_ - 1) {
        h = hring[hop % 2].as<float>();
        t = tring[hop % 2].as<std::int32_t>();
      }
    }
    // Our block's complete statistics return from the previous rank.
    float* st = part.as<float>();
    g_.recv(st, static_cast<std::size_t>(3 * T_), DType::f32, prev(), kTagStats);
    for (auto& r : stats_send) r.wait();
    LossSum out;
    out.loss = cpu::cross_entropy_finish(st, st + T_, st + 2 * T_, targets_, T_, o_.ignore_index, o_.z_loss,
                                         lse_.as<float>(), &out.count);
    return out;
  }

  void backward_activations(float scale, float* d_hidden, float* d_weight) {
    const std::int64_t H = o_.hidden, rows = shard_.rows;
    Buffer block = alloc(std::min(chunk_, tmax_) * std::max<std::int64_t>(rows, 1));
    Buffer hring[2], tring[2], lring[2], xring[2];
    std::vector<Request> dx_send(2);
    if (P_ > 1)
      for (int i = 0; i < 2; ++i) {
        hring[i] = alloc(tmax_ * H);
        tring[i] = alloc(tmax_);
        lring[i] = alloc(tmax_);
        xring[i] = alloc(tmax_ * H);
      }
    Buffer partial = P_ > 1 ? alloc(tmax_ * H) : Buffer();
    const float* h = hidden_;
    const std::int32_t* t = targets_;
    const float* lse = lse_.as<float>();
    for (int hop = 0; hop < P_; ++hop) {
      const int src = shard_at_hop(hop);
      const std::int64_t n = counts_[static_cast<std::size_t>(src)];
      InFlight io;
      if (hop < P_ - 1) {
        const std::int64_t nn = counts_[static_cast<std::size_t>(shard_at_hop(hop + 1))];
        io.add(g_.irecv(hring[hop % 2].data(), static_cast<std::size_t>(nn * H), DType::f32, prev(), kTagH));
        io.add(g_.irecv(tring[hop % 2].data(), static_cast<std::size_t>(nn), DType::i32, prev(), kTagT));
        io.add(g_.irecv(lring[hop % 2].data(), static_cast<std::size_t>(nn), DType::f32, prev(), kTagLse));
        io.add(g_.isend(h, static_cast<std::size_t>(n * H), DType::f32, next(), kTagH));
        io.add(g_.isend(t, static_cast<std::size_t>(n), DType::i32, next(), kTagT));
        io.add(g_.isend(lse, static_cast<std::size_t>(n), DType::f32, next(), kTagLse));
      }
      // dX of this block from our shard: into d_hidden when the block is ours and alone,
      // else into a partial that joins the travelling accumulator.
      float* dx = P_ == 1 ? d_hidden : (hop == 0 ? xring[0].as<float>() : partial.as<float>());
      if (n > 0) std::memset(dx, 0, static_cast<std::size_t>(n * H) * 4);
      for (std::int64_t c0 = 0; c0 < n && rows > 0; c0 += chunk_) {
        std::int64_t m = std::min(chunk_, n - c0);
        float* G = block.as<float>();
        logits(h + c0 * H, m, weight_, rows, G);
        cpu::cross_entropy_grad(G, m, rows, rows, lse + c0, t + c0, shard_.offset, o_.ignore_index, o_.z_loss, scale);
        cpu::gemm_f32(true, false, rows, H, m, 1.0f, G, rows, h + c0 * H, H, 1.0f, d_weight, H);
        cpu::gemm_f32(false, false, m, H, rows, 1.0f, G, rows, weight_, H, 0.0f, dx + c0 * H, H);
        io.progress();
      }
      if (P_ > 1) {
        float* slot = xring[hop % 2].as<float>();
        if (hop > 0) {
          dx_send[hop % 2].wait();
          g_.recv(slot, static_cast<std::size_t>(n * H), DType::f32, prev(), kTagAcc);
          cpu::axpy(slot, partial.as<float>(), n * H, 1.0f);
        }
        dx_send[hop % 2] = g_.isend(slot, static_cast<std::size_t>(n * H), DType::f32, next(), kTagAcc);
      }
      io.wait();
      if (hop < P_ - 1) {
        h = hring[hop % 2].as<float>();
        t = tring[hop % 2].as<std::int32_t>();
        lse = lring[hop % 2].as<float>();
      }
    }
    if (P_ > 1) {
      // Our tokens' complete dX returns from the previous rank.
      g_.recv(d_hidden, static_cast<std::size_t>(T_ * H), DType::f32, prev(), kTagAcc);
      for (auto& r : dx_send) r.wait();
    }
  }

  Device& dev_;
  Communicator& g_;
  VocabLossOptions o_;
  int P_, r_;
  VocabShard shard_;
  RingMode mode_ = RingMode::weights;
  const float* hidden_ = nullptr;
  const std::int32_t* targets_ = nullptr;
  const float* weight_ = nullptr;
  std::int64_t T_ = 0, tmax_ = 0, rows_max_ = 0, chunk_ = 1;
  std::vector<std::int64_t> counts_;
  Buffer lse_;
};

}  // namespace

std::unique_ptr<VocabLoss> make_ring_dtp_vocab_loss(Device& dev, Communicator& group, const VocabLossOptions& o) {
  if (o.vocab < 1 || o.hidden < 1) throw InvalidArgument("vocab loss: vocabulary and hidden size must be positive");
  if (o.chunk < 1) throw InvalidArgument("--chunk must be positive");
  return std::make_unique<RingDtp>(dev, group, o);
}

}  // namespace peakbound
