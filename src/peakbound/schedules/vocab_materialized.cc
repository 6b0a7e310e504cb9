// The baseline: Megatron-style vocab-parallel cross-entropy. Every rank gathers the
// group's hidden states, materializes fp32 logits [sum T, V/P] against its shard,
// all-reduces the row max, the sum of exponentials and the target logit, keeps the
// logits for backward, and there turns them into their gradient in place. Every
// buffer comes from materialized_vocab_buffers (vocab_footprint.h).
#include <algorithm>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/ops/cross_entropy.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/vocab_rows.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

namespace {

constexpr std::uint64_t kElemBytes = sizeof(float);  // the runtime's data is f32

class MaterializedVocabLoss final : public VocabLoss {
 public:
  MaterializedVocabLoss(Device& dev, Communicator& g, const VocabDims& d, const VocabLossOptions& o)
      : dev_(dev), s_(dev.compute_stream()), g_(g), d_(d), o_(o), shard_(vocab_shard(d.vocab, g.size(), g.rank())) {}

  std::string name() const override { return "materialized"; }
  Device& device() const override { return dev_; }

  LossSum forward(const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                  const float* weight) override {
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
    b_ = materialized_vocab_buffers(shape, o_, kElemBytes);
    const std::size_t P = counts_.size();
    offsets_.assign(P, 0);
    for (std::size_t i = 1; i < P; ++i) offsets_[i] = offsets_[i - 1] + counts_[i - 1];
    N_ = offsets_[P - 1] + counts_[P - 1];
    const std::int64_t H = d_.hidden, rows = shard_.rows;

    // Gather hidden states and targets of the whole group (the same block to every rank).
    hg_ = alloc(b_.hidden_all);
    tg_ = alloc(b_.targets_all);
    comm([&] { gather(hidden, hg_.as<float>(), H, DType::f32); });
    comm([&] { gather(targets, tg_.as<std::int32_t>(), 1, DType::i32); });

    logits_ = alloc(b_.logits);
    gemm(dev_, s_, false, true, N_, rows, H, 1.0f, hg_.as<float>(), H, weight, H, 0.0f, logits_.as<float>(), rows);

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

  void backward(float scale, float* d_hidden, float* d_weight) override {
    PB_CHECK_MSG(!logits_.empty() || N_ == 0 || shard_.rows == 0, "backward before forward");
    const std::int64_t H = d_.hidden, rows = shard_.rows;
    float* G = logits_.as<float>();
    ops::cross_entropy_grad(dev_, s_, G, N_, rows, rows, lse_.as<float>(), tg_.as<std::int32_t>(), shard_.offset,
                            o_.ignore_index, o_.z_loss, scale);
    // dW (this shard) += G^T Hg; dHg = G W, partial over the vocabulary shards.
    gemm(dev_, s_, true, false, rows, H, N_, 1.0f, G, rows, hg_.as<float>(), H, 1.0f, d_weight, H);
    Buffer dhg = alloc(b_.d_hidden_all);
    gemm(dev_, s_, false, false, N_, H, rows, 1.0f, G, rows, weight_, H, 0.0f, dhg.as<float>(), H);
    comm([&] { dev_.synchronize(s_); });
    logits_.reset();
    bool uniform = std::all_of(counts_.begin(), counts_.end(), [&](std::int64_t c) { return c == counts_[0]; });
    if (uniform) {
      comm([&] {
        g_.reduce_scatter(dhg.as<float>(), d_hidden, static_cast<std::size_t>(hidden_tokens_ * H), DType::f32,
                          ReduceOp::sum);
      });
    } else {
      // Uneven token counts: MPI's reduce-scatter-block needs equal blocks.
      comm([&] { g_.all_reduce(dhg.as<float>(), static_cast<std::size_t>(N_ * H), DType::f32, ReduceOp::sum); });
      std::int64_t off = offsets_[static_cast<std::size_t>(g_.rank())];
      dev_.memcpy_async(d_hidden, dhg.as<float>() + off * H, static_cast<std::uint64_t>(hidden_tokens_ * H) * sizeof(float),
                        CopyKind::device_to_device, s_);
      comm([&] { dev_.synchronize(s_); });  // dhg is released below
    }
    hg_.reset();
    tg_.reset();
    lse_.reset();
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
  const float* weight_ = nullptr;
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
