// The baseline: Megatron-style vocab-parallel cross-entropy. Every rank gathers the
// group's hidden states, materializes fp32 logits [sum T, V/P] against its shard,
// all-reduces the row max, the sum of exponentials and the target logit, keeps the
// logits for backward, and there turns them into their gradient in place. Every
// buffer comes from materialized_vocab_buffers (vocab_footprint.h).
//
// bf16 (A = bf16): the hidden states are gathered in bf16 and the logits are fp32 sums
// of exact products (ops::gemm_bf16). Backward narrows the gradient G in row tiles of
// kLinearTileRows into g16, then dW += G16^T Hg and dHg = G16 W, both fp32; dHg is
// reduce-scattered in f32 into d_hidden32 (or all-reduced in place for uneven counts)
// and narrowed once into d_hidden. A = float makes exactly the f32 calls.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/cross_entropy.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/vocab_rows.h"
#include "peakbound/nn/linear.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

namespace {

template <class A>
constexpr DType kAct = std::is_same_v<A, bf16> ? DType::bf16 : DType::f32;

class MaterializedVocabLoss final : public VocabLoss {
 public:
  MaterializedVocabLoss(Device& dev, Communicator& g, const VocabDims& d, const VocabLossOptions& o)
      : VocabLoss(o.precision), dev_(dev), s_(dev.compute_stream()), g_(g), d_(d), o_(o),
        shard_(vocab_shard(d.vocab, g.size(), g.rank())) {}

  std::string name() const override { return "materialized"; }
  Device& device() const override { return dev_; }

  LossSum forward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                      const void* weight) override {
    if (o_.precision == Precision::bf16)
      return fwd(static_cast<const bf16*>(hidden), targets, tokens, static_cast<const bf16*>(weight));
    return fwd(static_cast<const float*>(hidden), targets, tokens, static_cast<const float*>(weight));
  }

  void backward_any(float scale, void* d_hidden, float* d_weight) override {
    if (o_.precision == Precision::bf16)
      bwd(scale, static_cast<bf16*>(d_hidden), d_weight);
    else
      bwd(scale, static_cast<float*>(d_hidden), d_weight);
  }

 private:
  template <class A>
  LossSum fwd(const A* hidden, const std::int32_t* targets, std::int64_t tokens, const A* weight) {
    comm([&] { check_targets(dev_, g_, targets, tokens, d_.vocab, o_); });
    // A forward without a backward leaves its state held: drop it before allocating
    // this pass's, so two passes never hold their buffers at once.
    discard();
    hidden_tokens_ = tokens;
    weight_ = weight;
    VocabLossShape shape;
    shape.tokens = comm([&] { return gather_token_counts(g_, tokens); });
    shape.dims = d_;
    shape.rank = g_.rank();
    counts_ = shape.tokens;
    b_ = materialized_vocab_buffers(shape, o_, o_.precision);
    const std::size_t P = counts_.size();
    offsets_.assign(P, 0);
    for (std::size_t i = 1; i < P; ++i) offsets_[i] = offsets_[i - 1] + counts_[i - 1];
    N_ = offsets_[P - 1] + counts_[P - 1];
    const std::int64_t H = d_.hidden, rows = shard_.rows;

    // Gather hidden states and targets of the whole group (the same block to every rank).
    hg_ = alloc(b_.hidden_all);
    tg_ = alloc(b_.targets_all);
    comm([&] { gather(hidden, hg_.as<A>(), H, kAct<A>); });
    comm([&] { gather(targets, tg_.as<std::int32_t>(), 1, DType::i32); });

    logits_ = alloc(b_.logits);
    gemm(dev_, s_, false, true, N_, rows, H, 1.0f, hg_.as<A>(), H, weight, H, 0.0f, logits_.as<float>(), rows);

    // Row statistics over the whole vocabulary: max, then sum of exp, then target logit.
    lse_ = alloc(b_.lse);
    Buffer sum = alloc(b_.row_sum);
    Buffer tgt = alloc(b_.target_logit);
    float* mx = lse_.as<float>();
    float* sm = sum.as<float>();
    float* tl = tgt.as<float>();
    const float* L = logits_.as<float>();
    ops::vocab_row_max(dev_, s_, L, N_, rows, rows, mx);
    ops::fill(dev_, s_, tl, N_, 0.0f);
    comm([&] { dev_.synchronize(s_); });  // the collectives read what the compute stream wrote
    comm([&] { g_.all_reduce(mx, static_cast<std::size_t>(N_), DType::f32, ReduceOp::max); });
    ops::vocab_row_sum_exp(dev_, s_, L, N_, rows, rows, mx, sm);
    ops::gather_target_logit(dev_, s_, L, N_, rows, rows, tg_.as<std::int32_t>(), shard_.offset, tl);
    comm([&] { dev_.synchronize(s_); });
    comm([&] { g_.all_reduce(sm, static_cast<std::size_t>(N_), DType::f32, ReduceOp::sum); });
    comm([&] { g_.all_reduce(tl, static_cast<std::size_t>(N_), DType::f32, ReduceOp::sum); });
    // The max becomes the lse in place: this rank's rows as their loss is summed, the
    // other ranks' rows after (both max + log(sum), the same float arithmetic).
    const std::int64_t off = offsets_[static_cast<std::size_t>(g_.rank())];
    LossSum out;
    out.loss = ops::cross_entropy_finish(dev_, s_, mx + off, sm + off, tl + off, tg_.as<std::int32_t>() + off, tokens,
                                         o_.ignore_index, o_.z_loss, mx + off, &out.count);
    ops::vocab_lse_finalize(dev_, s_, mx, sm, off);
    ops::vocab_lse_finalize(dev_, s_, mx + off + tokens, sm + off + tokens, N_ - off - tokens);
    return out;
  }

  template <class A>
  void bwd(float scale, A* d_hidden, float* d_weight) {
    PB_CHECK_MSG(!logits_.empty() || N_ == 0 || shard_.rows == 0, "backward before forward");
    const std::int64_t H = d_.hidden, rows = shard_.rows;
    const A* weight = static_cast<const A*>(weight_);
    float* G = logits_.as<float>();
    ops::cross_entropy_grad(dev_, s_, G, N_, rows, rows, lse_.as<float>(), tg_.as<std::int32_t>(), shard_.offset,
                            o_.ignore_index, o_.z_loss, scale);
    // dW (this shard) += G^T Hg; dHg = G W, partial over the vocabulary shards.
    Buffer dhg, d32;  // d32: bf16's reduce-scatter result (allocated with the rest: one peak)
    if constexpr (std::is_same_v<A, float>) {
      gemm(dev_, s_, true, false, rows, H, N_, 1.0f, G, rows, hg_.as<float>(), H, 1.0f, d_weight, H);
      dhg = alloc(b_.d_hidden_all);
      gemm(dev_, s_, false, false, N_, H, rows, 1.0f, G, rows, weight, H, 0.0f, dhg.as<float>(), H);
    } else {
      dhg = alloc(b_.d_hidden_all);
      d32 = alloc(b_.d_hidden32);
      Buffer g16 = alloc(b_.g16);
      for (std::int64_t r0 = 0; r0 < N_; r0 += kLinearTileRows) {  // G narrowed a row tile at a time
        const std::int64_t n = std::min(kLinearTileRows, N_ - r0);
        ops::convert(dev_, s_, g16.as<bf16>(), G + r0 * rows, n * rows);
        gemm(dev_, s_, true, false, rows, H, n, 1.0f, g16.as<bf16>(), rows, hg_.as<bf16>() + r0 * H, H, 1.0f,
             d_weight, H);
        gemm(dev_, s_, false, false, n, H, rows, 1.0f, g16.as<bf16>(), rows, weight, H, 0.0f,
             dhg.as<float>() + r0 * H, H);
      }
    }
    comm([&] { dev_.synchronize(s_); });
    logits_.reset();
    scatter_d_hidden(dhg.as<float>(), d32.as<float>(), d_hidden);
    hg_.reset();
    tg_.reset();
    lse_.reset();
  }

  // d_hidden = this rank's rows of the group's sum of dHg (f32 collectives; under bf16
  // reduce-scattered into d32 [T, H] fp32, or all-reduced in dhg, and narrowed once).
  template <class A>
  void scatter_d_hidden(float* dhg, float* d32, A* d_hidden) {
    const std::int64_t H = d_.hidden;
    bool uniform = std::all_of(counts_.begin(), counts_.end(), [&](std::int64_t c) { return c == counts_[0]; });
    if (uniform) {
      float* out = nullptr;
      if constexpr (std::is_same_v<A, float>)
        out = d_hidden;
      else
        out = d32;
      comm([&] {
        g_.reduce_scatter(dhg, out, static_cast<std::size_t>(hidden_tokens_ * H), DType::f32, ReduceOp::sum);
      });
      if constexpr (std::is_same_v<A, bf16>) {
        ops::convert(dev_, s_, d_hidden, out, hidden_tokens_ * H);
        comm([&] { dev_.synchronize(s_); });  // d32 is released by the caller
      }
    } else {
      // Uneven token counts: MPI's reduce-scatter-block needs equal blocks.
      comm([&] { g_.all_reduce(dhg, static_cast<std::size_t>(N_ * H), DType::f32, ReduceOp::sum); });
      std::int64_t off = offsets_[static_cast<std::size_t>(g_.rank())];
      if constexpr (std::is_same_v<A, float>)
        dev_.memcpy_async(d_hidden, dhg + off * H, static_cast<std::uint64_t>(hidden_tokens_ * H) * sizeof(float),
                          CopyKind::device_to_device, s_);
      else
        ops::convert(dev_, s_, d_hidden, dhg + off * H, hidden_tokens_ * H);
      comm([&] { dev_.synchronize(s_); });  // dhg is released by the caller
    }
  }

 private:
  Buffer alloc(const BufferSpec& b) { return dev_.allocate(b.component, b.bytes); }

 public:
  void discard() override {
    hg_.reset();
    tg_.reset();
    logits_.reset();
    lse_.reset();
  }

 private:

  template <typename T>
  void gather(const T* mine, T* all, std::int64_t width, DType t) {
    const std::size_t P = counts_.size();
    std::vector<std::size_t> sc(P), sd(P, 0), rc(P), rd(P);
    for (std::size_t i = 0; i < P; ++i) {
      sc[i] = static_cast<std::size_t>(hidden_tokens_ * width);
      rc[i] = static_cast<std::size_t>(counts_[i] * width);
      rd[i] = static_cast<std::size_t>(offsets_[i] * width);
    }
    g_.all_to_all_v(mine, sc, sd, all, rc, rd, t);
  }

  Device& dev_;
  Stream& s_;
  Communicator& g_;
  VocabDims d_;
  VocabLossOptions o_;
  VocabShard shard_;
  MaterializedVocabBuffers b_;
  const void* weight_ = nullptr;
  std::int64_t hidden_tokens_ = 0, N_ = 0;
  std::vector<std::int64_t> counts_, offsets_;
  Buffer hg_, tg_, logits_, lse_;
};

}  // namespace

std::unique_ptr<VocabLoss> make_materialized_vocab_loss(Device& dev, Communicator& group, const VocabDims& d,
                                                        const VocabLossOptions& o) {
  validate(d);
  validate(o);
  return std::make_unique<MaterializedVocabLoss>(dev, group, d, o);
}

}  // namespace peakbound
