// Ring-DTP: the vocabulary projection and cross-entropy with a peak independent of
// the total tokens. Either the weight shards or the token blocks circulate around the
// vocabulary group (whichever is smaller); at each hop a rank computes [chunk, V/P]
// logits blocks and folds them into an online log-sum-exp. Backward recomputes the
// blocks from the saved log-sum-exp (or, with keep_logits, takes the forward's blocks,
// kept for it: the same products on the same operands, so the same bits, one GEMM of
// four fewer for [the group's tokens, V/P] fp32 held from forward to backward): in
// weights mode dW accumulators travel with the shards (a ring reduce-scatter) and dX stays; in activations mode dX travels with the
// tokens and dW stays at the shard's owner. The movement is RingExchange's: the next
// hop's transfer is posted before the current hop's compute and progressed between
// chunks, so it overlaps. Every buffer comes from ring_dtp_buffers (vocab_footprint.h).
//
// forward_backward at P = 1 is the fused form (Liger's fused linear cross-entropy, Cut
// Cross-Entropy): a token chunk's [chunk, V] block holds the whole vocabulary, so its
// log-sum-exp, loss and gradient G = scale (softmax (1 + 2 z lse) - onehot) follow at
// once, then dX_chunk = G W and dW += G^T X_chunk: 3 GEMMs a block instead of 4, no lse
// saved, a peak of one block whatever the token count. The scale must be known before
// the forward, hence the separate entry point (forward + backward keep the 4-GEMM form).
//
// bf16 (A = bf16): the hidden states, W and the carried lanes (W shard, token rows) are
// bf16; the logits blocks are fp32 sums of exact products (ops::gemm_bf16), the stats,
// lse, dW and the dW/dX accumulators stay fp32. Backward narrows each gradient block G
// into g16 once (on the CPU's convert path G is rounded in place instead, and both
// products read it as it is: ops::gemm_bf16_wide_a, the same bits without the copy and
// its two widenings), then dW += G16^T X and dX = G16 W in fp32: into d_hidden32 across the
// hops (weights mode, P > 1; narrowed at the end), into the travelling fp32 dX
// (activations mode; the finished sum is narrowed into d_hidden), or into dx_tile and
// narrowed chunk by chunk (P = 1 and the fused form). A = float makes exactly the f32
// calls.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/cross_entropy.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/schedules/ring_exchange.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

namespace {

// Tags of the forward and backward rings (one per lane from the base).
constexpr int kTagForward = 11, kTagBackward = 21;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
template <class A>
constexpr DType kAct = std::is_same_v<A, bf16> ? DType::bf16 : DType::f32;
template <class A>
constexpr bool kBf16 = std::is_same_v<A, bf16>;

std::size_t Z(std::int64_t v) { return static_cast<std::size_t>(v); }

class RingDtp final : public VocabLoss {
 public:
  RingDtp(Device& dev, Communicator& g, const VocabDims& d, const VocabLossOptions& o)
      : VocabLoss(o.precision), dev_(dev), s_(dev.compute_stream()), g_(g), d_(d), o_(o), P_(g.size()), r_(g.rank()),
        shard_(vocab_shard(d.vocab, P_, r_)) {}

  std::string name() const override { return "ring_dtp"; }
  Device& device() const override { return dev_; }
  std::string mode_used() const override { return fused_ ? "fused" : std::string(ring_mode_name(b_.mode)); }

  LossSum forward_backward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                               const void* weight, float scale, void* d_hidden, float* d_weight) override {
    if (P_ > 1) {
      fused_ = false;
      return VocabLoss::forward_backward_any(hidden, targets, tokens, weight, scale, d_hidden, d_weight);
    }
    if (o_.precision == Precision::bf16)
      return fused(static_cast<const bf16*>(hidden), targets, tokens, static_cast<const bf16*>(weight), scale,
                   static_cast<bf16*>(d_hidden), d_weight);
    return fused(static_cast<const float*>(hidden), targets, tokens, static_cast<const float*>(weight), scale,
                 static_cast<float*>(d_hidden), d_weight);
  }

  LossSum forward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                      const void* weight) override {
    comm([&] { check_targets(dev_, g_, targets, tokens, d_.vocab, o_); });
    discard();  // a forward without a backward held its state: never two at once
    fused_ = false;
    hidden_ = hidden;
    targets_ = targets;
    T_ = tokens;
    weight_ = weight;
    // Every rank's tokens and the tokens its buffers are sized for (reserve_tokens), in
    // one exchange: the work is the first's, the buffers (and the mode) the second's.
    const std::int64_t mine[2] = {tokens, std::max(tokens, reserved_)};
    std::vector<std::int64_t> both(Z(2 * P_));
    comm([&] { g_.all_gather(mine, both.data(), 2, DType::i64); });
    shape_.tokens.assign(Z(P_), 0);
    shape_.dims = d_;
    shape_.rank = r_;
    VocabLossShape sized = shape_;
    for (int i = 0; i < P_; ++i) {
      shape_.tokens[Z(i)] = both[Z(2 * i)];
      sized.tokens[Z(i)] = both[Z(2 * i + 1)];
    }
    b_ = ring_dtp_buffers(sized, o_, o_.precision);
    lse_ = alloc(b_.lse);
    kept_ = alloc(b_.kept);
    if (o_.precision == Precision::bf16)
      return b_.mode == RingMode::weights ? forward_weights<bf16>() : forward_activations<bf16>();
    return b_.mode == RingMode::weights ? forward_weights<float>() : forward_activations<float>();
  }

  void backward_any(float scale, void* d_hidden, float* d_weight) override {
    const bool w = b_.mode == RingMode::weights;
    if (o_.precision == Precision::bf16) {
      if (w)
        backward_weights(scale, static_cast<bf16*>(d_hidden), d_weight);
      else
        backward_activations(scale, static_cast<bf16*>(d_hidden), d_weight);
    } else {
      if (w)
        backward_weights(scale, static_cast<float*>(d_hidden), d_weight);
      else
        backward_activations(scale, static_cast<float*>(d_hidden), d_weight);
    }
    lse_.reset();
    kept_.reset();
  }

 private:
  // The fused P = 1 step (see the top of the file).
  template <class A>
  LossSum fused(const A* hidden, const std::int32_t* targets, std::int64_t tokens, const A* weight, float scale,
                A* d_hidden, float* d_weight) {
    comm([&] { check_targets(dev_, g_, targets, tokens, d_.vocab, o_); });
    discard();
    fused_ = true;
    shape_.tokens = {std::max(tokens, reserved_)};  // the buffers' size (reserve_tokens)
    shape_.dims = d_;
    shape_.rank = r_;
    b_ = ring_dtp_buffers(shape_, o_, o_.precision);
    const std::int64_t H = d_.hidden, V = d_.vocab;
    Buffer block = alloc(b_.fused_block), g16 = alloc(b_.fused_g16), tile = alloc(b_.dx_tile);
    LossSum out;
    for (std::int64_t c0 = 0; c0 < tokens; c0 += o_.chunk) {
      const std::int64_t n = std::min(o_.chunk, tokens - c0);
      float* G = block.as<float>();
      logits(hidden + c0 * H, n, weight, V, G);
      std::int64_t valid = 0;
      out.loss += ops::cross_entropy_fused_grad(dev_, s_, G, n, V, V, targets + c0, o_.ignore_index, o_.z_loss, scale,
                                                &valid);
      out.count += valid;
      if (valid == 0) {  // every target ignored: a zero gradient, no GEMM needed
        ops::fill(dev_, s_, d_hidden + c0 * H, n * H, 0.0f);
        continue;
      }
      // dX straight into d_hidden (f32), or through the fp32 tile and narrowed (bf16).
      float* dx = tile.as<float>();
      if constexpr (!kBf16<A>) dx = d_hidden + c0 * H;
      grad_products(G, n, V, hidden + c0 * H, weight, 1.0f, d_weight, 0.0f, dx, g16.as<bf16>());
      if constexpr (kBf16<A>) ops::convert(dev_, s_, d_hidden + c0 * H, dx, n * H);
    }
    return out;
  }

 private:
  Buffer alloc(const BufferSpec& b) { return dev_.allocate(b.component, b.bytes); }

 public:
  void discard() override {
    lse_.reset();
    kept_.reset();
  }

 private:
  // A lane's two buffers, allocated from its spec.
  struct Slots {
    Buffer buf[2];
    std::array<void*, 2> ptrs() { return {buf[0].data(), buf[1].data()}; }
  };
  Slots alloc_lane(const BufferSpec& b) { return Slots{{alloc(b), alloc(b)}}; }
  std::int64_t rows_of(int rank) const { return vocab_shard(d_.vocab, P_, rank).rows; }
  std::vector<std::size_t> per_rank(std::int64_t (*f)(const RingDtp&, int), std::int64_t width) const {
    std::vector<std::size_t> c(Z(P_));
    for (int i = 0; i < P_; ++i) c[Z(i)] = Z(f(*this, i) * width);
    return c;
  }
  static std::int64_t shard_rows(const RingDtp& self, int i) { return self.rows_of(i); }
  static std::int64_t token_count(const RingDtp& self, int i) { return self.shape_.tokens[Z(i)]; }

  // Logits of `n` token rows against a shard, into the fp32 block buffer.
  template <class A>
  void logits(const A* h, std::int64_t n, const A* w, std::int64_t rows, float* block) {
    gemm(dev_, s_, false, true, n, rows, d_.hidden, 1.0f, h, d_.hidden, w, d_.hidden, 0.0f, block, rows);
  }
  bool keeping() const { return kept_.data() != nullptr; }
  // Where the logits block of token rows [c0, c0 + n) of the hop's set goes, row stride
  // `rows`: `block` (the one block buffer) without keep_logits; with it its own place of
  // the kept buffer, every (token, shard) pair having one (weights mode: our tokens against
  // shard `sh`, by the shard's offset; activations mode: the block of rank `origin`'s
  // tokens against our shard, by the tokens of the ranks before it).
  float* weights_block(float* block, const VocabShard& sh, std::int64_t c0) {
    return keeping() ? kept_.as<float>() + T_ * sh.offset + c0 * sh.rows : block;
  }
  float* activations_block(float* block, int origin, std::int64_t c0) {
    if (!keeping()) return block;
    std::int64_t before = 0;
    for (int i = 0; i < origin; ++i) before += shape_.tokens[Z(i)];
    return kept_.as<float>() + (before + c0) * shard_.rows;
  }

  // ---- weights mode: shards travel, tokens stay ------------------------------------
  template <class A>
  LossSum forward_weights() {
    const std::int64_t H = d_.hidden, chunk = o_.chunk;
    const A* hidden = static_cast<const A*>(hidden_);
    Buffer stats = alloc(b_.fwd_stats);
    float *mx = stats.as<float>(), *sm = mx + T_, *tl = sm + T_;
    ops::fill(dev_, s_, mx, T_, kNegInf);
    ops::fill(dev_, s_, sm, T_, 0.0f);
    ops::fill(dev_, s_, tl, T_, 0.0f);
    Buffer block = alloc(b_.fwd_block);
    Slots w;
    RingExchange ring(dev_, g_, kTagForward);
    if (P_ > 1) {
      w = alloc_lane(b_.fwd_lanes[RingDtpBuffers::kWeight]);
      ring.add_carried(weight_, RingLane{w.ptrs(), kAct<A>, per_rank(shard_rows, H)});
    } else {
      ring.add_carried(weight_, RingLane{{}, kAct<A>, {Z(shard_.rows * H)}});
    }
    for (int hop = 0; hop < P_; ++hop) {
      VocabShard sh = vocab_shard(d_.vocab, P_, ring.origin(hop));
      comm([&] { ring.begin(hop); });
      const A* cur = static_cast<const A*>(ring.carried(RingDtpBuffers::kWeight));
      for (std::int64_t c0 = 0; c0 < T_ && sh.rows > 0; c0 += chunk) {
        std::int64_t n = std::min(chunk, T_ - c0);
        float* L = weights_block(block.as<float>(), sh, c0);
        logits(hidden + c0 * H, n, cur, sh.rows, L);
        ops::lse_update(dev_, s_, L, n, sh.rows, sh.rows, mx + c0, sm + c0);
        ops::gather_target_logit(dev_, s_, L, n, sh.rows, sh.rows, targets_ + c0, sh.offset, tl + c0);
        comm([&] { ring.progress(); });
      }
      comm([&] { ring.end(hop); });
    }
    LossSum out;
    out.loss = ops::cross_entropy_finish(dev_, s_, mx, sm, tl, targets_, T_, o_.ignore_index, o_.z_loss,
                                         lse_.as<float>(), &out.count);
    return out;
  }

  // One block's gradient products, G [n, rows] (fp32, the loss gradient) against the
  // token rows x [n, H] and the shard w [rows, H]: dw [rows, H] = beta_w dw + G^T x, then
  // dx [n, H] = beta_x dx + G w, both fp32. Under bf16 G is narrowed into g16 first.
  template <class A>
  void grad_products(float* G, std::int64_t n, std::int64_t rows, const A* x, const A* w, float beta_w, float* dw,
                     float beta_x, float* dx, bf16* g16) {
    const std::int64_t H = d_.hidden;
    if constexpr (kBf16<A>) {
      if (ops::gemm_bf16_takes_wide_a(dev_)) {  // G rounded in place: the same operand, no copy to widen
        ops::round_bf16(dev_, s_, G, n * rows);
        gemm(dev_, s_, true, false, rows, H, n, 1.0f, static_cast<const float*>(G), rows, x, H, beta_w, dw, H);
        gemm(dev_, s_, false, false, n, H, rows, 1.0f, static_cast<const float*>(G), rows, w, H, beta_x, dx, H);
        return;
      }
      ops::convert(dev_, s_, g16, G, n * rows);
      gemm(dev_, s_, true, false, rows, H, n, 1.0f, g16, rows, x, H, beta_w, dw, H);
      gemm(dev_, s_, false, false, n, H, rows, 1.0f, g16, rows, w, H, beta_x, dx, H);
    } else {
      gemm(dev_, s_, true, false, rows, H, n, 1.0f, G, rows, x, H, beta_w, dw, H);
      gemm(dev_, s_, false, false, n, H, rows, 1.0f, G, rows, w, H, beta_x, dx, H);
    }
  }

  template <class A>
  void backward_weights(float scale, A* d_hidden, float* d_weight) {
    const std::int64_t H = d_.hidden, chunk = o_.chunk;
    const A* hidden = static_cast<const A*>(hidden_);
    // dX's fp32 sum over the hops: d_hidden itself (f32) or d32 (bf16, P > 1); null for
    // bf16 at P = 1, where each chunk's dX goes through the tile and is narrowed at once.
    Buffer d32 = alloc(b_.d_hidden32);
    float* dx_all = nullptr;
    if constexpr (kBf16<A>)
      dx_all = d32.as<float>();
    else
      dx_all = d_hidden;
    if (dx_all) ops::fill(dev_, s_, dx_all, T_ * H, 0.0f);
    Buffer block = alloc(b_.bwd_block), g16 = alloc(b_.g16), tile = alloc(b_.dx_tile);
    Slots w, acc;
    Buffer partial;
    RingExchange ring(dev_, g_, kTagBackward);
    if (P_ > 1) {
      w = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kWeight]);
      acc = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kWeightGrad]);
      partial = alloc(b_.bwd_partial);
      ring.add_carried(weight_, RingLane{w.ptrs(), kAct<A>, per_rank(shard_rows, H)});
      ring.add_accumulated(RingLane{acc.ptrs(), DType::f32, per_rank(shard_rows, H)});
    } else {
      ring.add_carried(weight_, RingLane{{}, kAct<A>, {Z(shard_.rows * H)}});
    }
    for (int hop = 0; hop < P_; ++hop) {
      VocabShard sh = vocab_shard(d_.vocab, P_, ring.origin(hop));
      const std::int64_t n_sh = sh.rows * H;
      comm([&] { ring.begin(hop); });
      const A* cur = static_cast<const A*>(ring.carried(RingDtpBuffers::kWeight));
      // Our tokens' contribution to dW of this shard: straight into the travelling
      // accumulator at hop 0, into `partial` later (added once the accumulator is in).
      float* dw = P_ == 1 ? d_weight
                          : (hop == 0 ? static_cast<float*>(ring.accumulator(0)) : partial.as<float>());
      const float beta0 = P_ == 1 ? 1.0f : 0.0f;
      if (sh.rows > 0 && T_ == 0 && P_ > 1) ops::fill(dev_, s_, dw, n_sh, 0.0f);
      for (std::int64_t c0 = 0; c0 < T_ && sh.rows > 0; c0 += chunk) {
        std::int64_t n = std::min(chunk, T_ - c0);
        // The forward's block where it kept it (turned into its gradient in place), else again.
        float* G = weights_block(block.as<float>(), sh, c0);
        if (!keeping()) logits(hidden + c0 * H, n, cur, sh.rows, G);
        ops::cross_entropy_grad(dev_, s_, G, n, sh.rows, sh.rows, lse_.as<float>() + c0, targets_ + c0, sh.offset,
                                o_.ignore_index, o_.z_loss, scale);
        float* dx = dx_all ? dx_all + c0 * H : tile.as<float>();
        grad_products(G, n, sh.rows, hidden + c0 * H, cur, c0 == 0 ? beta0 : 1.0f, dw, dx_all ? 1.0f : 0.0f, dx,
                      g16.as<bf16>());
        if constexpr (kBf16<A>)
          if (!dx_all) ops::convert(dev_, s_, d_hidden + c0 * H, dx, n * H);
        comm([&] { ring.progress(); });
      }
      if (P_ > 1) {
        if (hop > 0) {
          comm([&] { ring.wait_accumulated(); });
          ops::axpy(dev_, s_, static_cast<float*>(ring.accumulator(0)), partial.as<float>(), n_sh, 1.0f);
        }
        // After the last hop this goes to the shard's owner (our next rank).
        comm([&] { ring.send_accumulated(); });
      }
      comm([&] { ring.end(hop); });
    }
    if (P_ > 1) {
      // Our own shard's complete gradient comes back from the previous rank.
      const float* mine = static_cast<const float*>(comm([&] { return ring.finish(0); }));
      ops::axpy(dev_, s_, d_weight, mine, shard_.rows * H, 1.0f);
    }
    if constexpr (kBf16<A>)
      if (dx_all) ops::convert(dev_, s_, d_hidden, dx_all, T_ * H);
  }

  // ---- activations mode: token blocks travel, shards stay -------------------------
  template <class A>
  LossSum forward_activations() {
    const std::int64_t H = d_.hidden, rows = shard_.rows, chunk = o_.chunk;
    const A* weight = static_cast<const A*>(weight_);
    Buffer block = alloc(b_.fwd_block);
    Slots h_lane, t_lane, s_lane;
    RingExchange ring(dev_, g_, kTagForward);
    if (P_ > 1) {
      h_lane = alloc_lane(b_.fwd_lanes[RingDtpBuffers::kHidden]);
      t_lane = alloc_lane(b_.fwd_lanes[RingDtpBuffers::kTargets]);
      s_lane = alloc_lane(b_.fwd_lanes[RingDtpBuffers::kStats]);
      ring.add_carried(hidden_, RingLane{h_lane.ptrs(), kAct<A>, per_rank(token_count, H)});
      ring.add_carried(targets_, RingLane{t_lane.ptrs(), DType::i32, per_rank(token_count, 1)});
      ring.add_accumulated(RingLane{s_lane.ptrs(), DType::f32, per_rank(token_count, 3)});
    } else {
      ring.add_carried(hidden_, RingLane{{}, kAct<A>, {Z(T_ * H)}});
      ring.add_carried(targets_, RingLane{{}, DType::i32, {Z(T_)}});
    }
    Buffer part = alloc(b_.fwd_stats);  // this rank's partial stats for the current block
    for (int hop = 0; hop < P_; ++hop) {
      const std::int64_t n = shape_.tokens[Z(ring.origin(hop))];
      comm([&] { ring.begin(hop); });
      const A* h = static_cast<const A*>(ring.carried(RingDtpBuffers::kHidden));
      const std::int32_t* t = static_cast<const std::int32_t*>(ring.carried(RingDtpBuffers::kTargets));
      // At hop 0 the block's statistics start in the travelling slot itself.
      float* mx = P_ > 1 && hop == 0 ? static_cast<float*>(ring.accumulator(0)) : part.as<float>();
      float *sm = mx + n, *tl = sm + n;
      ops::fill(dev_, s_, mx, n, kNegInf);
      ops::fill(dev_, s_, sm, n, 0.0f);
      ops::fill(dev_, s_, tl, n, 0.0f);
      for (std::int64_t c0 = 0; c0 < n && rows > 0; c0 += chunk) {
        std::int64_t m = std::min(chunk, n - c0);
        float* L = activations_block(block.as<float>(), ring.origin(hop), c0);
        logits(h + c0 * H, m, weight, rows, L);
        ops::lse_update(dev_, s_, L, m, rows, rows, mx + c0, sm + c0);
        ops::gather_target_logit(dev_, s_, L, m, rows, rows, t + c0, shard_.offset, tl + c0);
        comm([&] { ring.progress(); });
      }
      if (P_ == 1) {
        LossSum out;
        out.loss = ops::cross_entropy_finish(dev_, s_, mx, sm, tl, targets_, T_, o_.ignore_index, o_.z_loss,
                                             lse_.as<float>(), &out.count);
        return out;
      }
      // Merge with the statistics the block brought from earlier ranks, pass them on.
      if (hop > 0) {
        comm([&] { ring.wait_accumulated(); });
        float* st = static_cast<float*>(ring.accumulator(0));
        ops::lse_merge(dev_, s_, st, st + n, st + 2 * n, mx, sm, tl, n);
      }
      comm([&] { ring.send_accumulated(); });
      comm([&] { ring.end(hop); });
    }
    // Our block's complete statistics return from the previous rank.
    float* st = static_cast<float*>(comm([&] { return ring.finish(0, part.data()); }));
    LossSum out;
    out.loss = ops::cross_entropy_finish(dev_, s_, st, st + T_, st + 2 * T_, targets_, T_, o_.ignore_index, o_.z_loss,
                                         lse_.as<float>(), &out.count);
    return out;
  }

  template <class A>
  void backward_activations(float scale, A* d_hidden, float* d_weight) {
    const std::int64_t H = d_.hidden, rows = shard_.rows, chunk = o_.chunk;
    const A* weight = static_cast<const A*>(weight_);
    Buffer block = alloc(b_.bwd_block), g16 = alloc(b_.g16), tile = alloc(b_.dx_tile);
    Slots h_lane, t_lane, l_lane, x_lane;
    Buffer partial;
    RingExchange ring(dev_, g_, kTagBackward);
    if (P_ > 1) {
      h_lane = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kHidden]);
      t_lane = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kTargets]);
      l_lane = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kLse]);
      x_lane = alloc_lane(b_.bwd_lanes[RingDtpBuffers::kHiddenGrad]);
      partial = alloc(b_.bwd_partial);
      ring.add_carried(hidden_, RingLane{h_lane.ptrs(), kAct<A>, per_rank(token_count, H)});
      ring.add_carried(targets_, RingLane{t_lane.ptrs(), DType::i32, per_rank(token_count, 1)});
      ring.add_carried(lse_.data(), RingLane{l_lane.ptrs(), DType::f32, per_rank(token_count, 1)});
      ring.add_accumulated(RingLane{x_lane.ptrs(), DType::f32, per_rank(token_count, H)});
    } else {
      ring.add_carried(hidden_, RingLane{{}, kAct<A>, {Z(T_ * H)}});
      ring.add_carried(targets_, RingLane{{}, DType::i32, {Z(T_)}});
      ring.add_carried(lse_.data(), RingLane{{}, DType::f32, {Z(T_)}});
    }
    for (int hop = 0; hop < P_; ++hop) {
      const std::int64_t n = shape_.tokens[Z(ring.origin(hop))];
      comm([&] { ring.begin(hop); });
      const A* h = static_cast<const A*>(ring.carried(RingDtpBuffers::kHidden));
      const std::int32_t* t = static_cast<const std::int32_t*>(ring.carried(RingDtpBuffers::kTargets));
      const float* lse = static_cast<const float*>(ring.carried(RingDtpBuffers::kLse));
      // dX of this block from our shard: into d_hidden when the block is ours and alone
      // (f32; bf16 writes each chunk through the tile instead, dx null), into the
      // travelling fp32 accumulator at hop 0, else into a partial that joins it.
      float* dx = nullptr;
      if (P_ > 1)
        dx = hop == 0 ? static_cast<float*>(ring.accumulator(0)) : partial.as<float>();
      else if constexpr (!kBf16<A>)
        dx = d_hidden;
      if (dx) ops::fill(dev_, s_, dx, n * H, 0.0f);
      for (std::int64_t c0 = 0; c0 < n && rows > 0; c0 += chunk) {
        std::int64_t m = std::min(chunk, n - c0);
        float* G = activations_block(block.as<float>(), ring.origin(hop), c0);
        if (!keeping()) logits(h + c0 * H, m, weight, rows, G);
        ops::cross_entropy_grad(dev_, s_, G, m, rows, rows, lse + c0, t + c0, shard_.offset, o_.ignore_index,
                                o_.z_loss, scale);
        float* dxc = dx ? dx + c0 * H : tile.as<float>();
        grad_products(G, m, rows, h + c0 * H, weight, 1.0f, d_weight, 0.0f, dxc, g16.as<bf16>());
        if constexpr (kBf16<A>)
          if (!dx) ops::convert(dev_, s_, d_hidden + c0 * H, dxc, m * H);
        comm([&] { ring.progress(); });
      }
      if (P_ > 1) {
        if (hop > 0) {
          comm([&] { ring.wait_accumulated(); });
          ops::axpy(dev_, s_, static_cast<float*>(ring.accumulator(0)), partial.as<float>(), n * H, 1.0f);
        }
        comm([&] { ring.send_accumulated(); });
      }
      comm([&] { ring.end(hop); });
    }
    // Our tokens' complete dX returns from the previous rank (bf16: into the lane's
    // free fp32 slot, then narrowed once).
    if (P_ > 1) {
      if constexpr (kBf16<A>) {
        const float* mine = static_cast<const float*>(comm([&] { return ring.finish(0); }));
        ops::convert(dev_, s_, d_hidden, mine, T_ * H);
      } else {
        comm([&] { ring.finish(0, d_hidden); });
      }
    }
  }

  Device& dev_;
  Stream& s_;
  Communicator& g_;
  VocabDims d_;
  VocabLossOptions o_;
  int P_, r_;
  VocabShard shard_;
  VocabLossShape shape_;
  RingDtpBuffers b_;
  const void* hidden_ = nullptr;  // f32 | bf16, as the precision
  const std::int32_t* targets_ = nullptr;
  const void* weight_ = nullptr;
  std::int64_t T_ = 0;
  Buffer lse_;
  Buffer kept_;  // keep_logits (P > 1): the forward's logits blocks for the backward
  bool fused_ = false;  // the last step took the fused form
};

}  // namespace

std::unique_ptr<VocabLoss> make_ring_dtp_vocab_loss(Device& dev, Communicator& group, const VocabDims& d,
                                                    const VocabLossOptions& o) {
  validate(d);
  validate(o);
  return std::make_unique<RingDtp>(dev, group, d, o);
}

}  // namespace peakbound
