// The baseline: Megatron-style vocab-parallel cross-entropy. Every rank gathers the
// group's hidden states, materializes fp32 logits [sum T, V/P] against its shard,
// all-reduces the row max, the sum of exponentials and the target logit, keeps the
// logits for backward, and there turns them into their gradient in place.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/cross_entropy.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

namespace {

class MaterializedVocabLoss final : public VocabLoss {
 public:
  MaterializedVocabLoss(Device& dev, Communicator& g, const VocabLossOptions& o)
      : dev_(dev), g_(g), o_(o), shard_(vocab_shard(o.vocab, g.size(), g.rank())) {}

  std::string name() const override { return "materialized"; }

  LossSum forward(const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                  const float* weight) override {
    check_targets(g_, targets, tokens, o_);
    hidden_tokens_ = tokens;
    weight_ = weight;
    counts_ = gather_token_counts(g_, tokens);
    const std::size_t P = counts_.size();
    offsets_.assign(P, 0);
    for (std::size_t i = 1; i < P; ++i) offsets_[i] = offsets_[i - 1] + counts_[i - 1];
    N_ = offsets_[P - 1] + counts_[P - 1];
    const std::int64_t H = o_.hidden, rows = shard_.rows;

    // Gather hidden states and targets of the whole group (the same block to every rank).
    hg_ = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_ * H) * 4);
    tg_ = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_) * 4);
    gather(hidden, hg_.as<float>(), H, DType::f32);
    gather(targets, tg_.as<std::int32_t>(), 1, DType::i32);

    logits_ = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_ * rows) * 4);
    cpu::gemm_f32(false, true, N_, rows, H, 1.0f, hg_.as<float>(), H, weight, H, 0.0f, logits_.as<float>(), rows);

    // Row statistics over the whole vocabulary: max, then sum of exp, then target logit.
    lse_ = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_) * 4);
    Buffer sum = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_) * 4);
    Buffer tgt = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_) * 4);
    float* mx = lse_.as<float>();
    float* sm = sum.as<float>();
    float* tl = tgt.as<float>();
    const float* L = logits_.as<float>();
    for (std::int64_t i = 0; i < N_; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < rows; ++j) m = std::max(m, L[i * rows + j]);
      mx[i] = m;
      tl[i] = 0.0f;
    }
    g_.all_reduce(mx, static_cast<std::size_t>(N_), DType::f32, ReduceOp::max);
    for (std::int64_t i = 0; i < N_; ++i) {
      float s = 0.0f;
      for (std::int64_t j = 0; j < rows; ++j) s += std::exp(L[i * rows + j] - mx[i]);
      sm[i] = s;
    }
    cpu::gather_target_logit(L, N_, rows, rows, tg_.as<std::int32_t>(), shard_.offset, tl);
    g_.all_reduce(sm, static_cast<std::size_t>(N_), DType::f32, ReduceOp::sum);
    g_.all_reduce(tl, static_cast<std::size_t>(N_), DType::f32, ReduceOp::sum);
    // lse overwrites the max in place; the loss covers this rank's own rows.
    std::vector<float> own_lse(static_cast<std::size_t>(tokens));
    std::int64_t off = offsets_[static_cast<std::size_t>(g_.rank())];
    LossSum out;
    out.loss = cpu::cross_entropy_finish(mx + off, sm + off, tl + off, tg_.as<std::int32_t>() + off, tokens,
                                         o_.ignore_index, o_.z_loss, own_lse.data(), &out.count);
    for (std::int64_t i = 0; i < N_; ++i) mx[i] = mx[i] + std::log(sm[i]);
    return out;
  }

  void backward(float scale, float* d_hidden, float* d_weight) override {
    PB_CHECK_MSG(!logits_.empty() || N_ == 0 || shard_.rows == 0, "backward before forward");
    const std::int64_t H = o_.hidden, rows = shard_.rows;
    float* G = logits_.as<float>();
    cpu::cross_entropy_grad(G, N_, rows, rows, lse_.as<float>(), tg_.as<std::int32_t>(), shard_.offset,
                            o_.ignore_index, o_.z_loss, scale);
    // dW (this shard) += G^T Hg; dHg = G W, partial over the vocabulary shards.
    cpu::gemm_f32(true, false, rows, H, N_, 1.0f, G, rows, hg_.as<float>(), H, 1.0f, d_weight, H);
    Buffer dhg = dev_.allocate(Component::vocab, static_cast<std::uint64_t>(N_ * H) * 4);
    cpu::gemm_f32(false, false, N_, H, rows, 1.0f, G, rows, weight_, H, 0.0f, dhg.as<float>(), H);
    logits_.reset();
    bool uniform = std::all_of(counts_.begin(), counts_.end(), [&](std::int64_t c) { return c == counts_[0]; });
    if (uniform) {
      g_.reduce_scatter(dhg.as<float>(), d_hidden, static_cast<std::size_t>(hidden_tokens_ * H), DType::f32,
                        ReduceOp::sum);
    } else {
      // Uneven token counts: MPI's reduce-scatter-block needs equal blocks.
      g_.all_reduce(dhg.as<float>(), static_cast<std::size_t>(N_ * H), DType::f32, ReduceOp::sum);
      std::int64_t off = offsets_[static_cast<std::size_t>(g_.rank())];
      if (hidden_tokens_ > 0)
        std::memcpy(d_hidden, dhg.as<float>() + off * H, static_cast<std::size_t>(hidden_tokens_ * H) * 4);
    }
    hg_.reset();
    tg_.reset();
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
  Communicator& g_;
  VocabLossOptions o_;
  VocabShard shard_;
  const float* weight_ = nullptr;
  std::int64_t hidden_tokens_ = 0, N_ = 0;
  std::vector<std::int64_t> counts_, offsets_;
  Buffer hg_, tg_, logits_, lse_;
};

}  // namespace

std::unique_ptr<VocabLoss> make_materialized_vocab_loss(Device& dev, Communicator& group,
                                                        const VocabLossOptions& o) {
  if (o.vocab < 1 || o.hidden < 1) throw InvalidArgument("vocab loss: vocabulary and hidden size must be positive");
  return std::make_unique<MaterializedVocabLoss>(dev, group, o);
}

}  // namespace peakbound
