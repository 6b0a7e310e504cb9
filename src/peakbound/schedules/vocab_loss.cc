#include "peakbound/schedules/vocab_loss.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {

VocabShard vocab_shard(std::int64_t vocab, int ranks, int rank) {
  std::int64_t base = vocab / ranks, rem = vocab % ranks;
  VocabShard s;
  s.rows = base + (rank < rem ? 1 : 0);
  s.offset = rank * base + std::min<std::int64_t>(rank, rem);
  return s;
}

std::string_view ring_mode_name(RingMode m) {
  switch (m) {
    case RingMode::automatic: return "auto";
    case RingMode::activations: return "activations";
    case RingMode::weights: return "weights";
  }
  return "?";
}

RingMode parse_ring_mode(std::string_view s) {
  if (s == "auto") return RingMode::automatic;
  if (s == "activations") return RingMode::activations;
  if (s == "weights") return RingMode::weights;
  throw InvalidArgument("vocab loss mode '" + std::string(s) + "' is not auto, activations or weights");
}

void validate(const VocabLossOptions& o) {
  if (o.chunk < 1) throw InvalidArgument("vocab loss chunk must be positive (got " + std::to_string(o.chunk) + ")");
  if (!std::isfinite(o.z_loss) || o.z_loss < 0.0f)
    throw InvalidArgument("vocab loss z_loss must be finite and non-negative (got " + std::to_string(o.z_loss) + ")");
  if (o.mode != RingMode::automatic && o.mode != RingMode::activations && o.mode != RingMode::weights)
    throw InvalidArgument("vocab loss mode " + std::to_string(static_cast<int>(o.mode)) + " is not auto, activations or weights");
}

void validate(const VocabDims& d) {
  if (d.vocab < 1) throw InvalidArgument("vocab loss vocab must be positive (got " + std::to_string(d.vocab) + ")");
  if (d.hidden < 1) throw InvalidArgument("vocab loss hidden must be positive (got " + std::to_string(d.hidden) + ")");
  if (d.vocab > std::int64_t{1} << 31)
    throw InvalidArgument("vocab loss vocab " + std::to_string(d.vocab) + " does not fit the int32 targets");
}

void VocabLoss::expect(Precision p) const {
  check_precision(precision_, p, "vocab loss", "hidden states");
}

LossSum VocabLoss::forward(const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                           const float* weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::f32);
  return forward_any(hidden, targets, tokens, weight);
}

LossSum VocabLoss::forward(const bf16* hidden, const std::int32_t* targets, std::int64_t tokens, const bf16* weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::bf16);
  return forward_any(hidden, targets, tokens, weight);
}

void VocabLoss::backward(float scale, float* d_hidden, float* d_weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::f32);
  backward_any(scale, d_hidden, d_weight);
}

void VocabLoss::backward(float scale, bf16* d_hidden, float* d_weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::bf16);
  backward_any(scale, d_hidden, d_weight);
}

LossSum VocabLoss::forward_backward(const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                                    const float* weight, float scale, float* d_hidden, float* d_weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::f32);
  return forward_backward_any(hidden, targets, tokens, weight, scale, d_hidden, d_weight);
}

LossSum VocabLoss::forward_backward(const bf16* hidden, const std::int32_t* targets, std::int64_t tokens,
                                    const bf16* weight, float scale, bf16* d_hidden, float* d_weight) {
  const PhaseScope phase(StepPhase::vocabulary);
  expect(Precision::bf16);
  return forward_backward_any(hidden, targets, tokens, weight, scale, d_hidden, d_weight);
}

LossSum VocabLoss::forward_backward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                                        const void* weight, float scale, void* d_hidden, float* d_weight) {
  const LossSum out = forward_any(hidden, targets, tokens, weight);
  backward_any(scale, d_hidden, d_weight);
  return out;
}

template <class A, class B>
void VocabLoss::gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                     std::int64_t k, float alpha, const A* a, std::int64_t lda, const B* b, std::int64_t ldb,
                     float beta, float* c, std::int64_t ldc) {
  const auto t0 = std::chrono::steady_clock::now();
  if constexpr (std::is_same_v<A, B>)
    ops::gemm(dev, s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    ops::gemm_bf16_wide_a(dev, s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  stats_.gemm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.gemm_flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  ++stats_.gemm_calls;
}
template void VocabLoss::gemm<float>(Device&, Stream&, bool, bool, std::int64_t, std::int64_t, std::int64_t, float,
                                     const float*, std::int64_t, const float*, std::int64_t, float, float*,
                                     std::int64_t);
template void VocabLoss::gemm<bf16>(Device&, Stream&, bool, bool, std::int64_t, std::int64_t, std::int64_t, float,
                                    const bf16*, std::int64_t, const bf16*, std::int64_t, float, float*, std::int64_t);
template void VocabLoss::gemm<float, bf16>(Device&, Stream&, bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                           float, const float*, std::int64_t, const bf16*, std::int64_t, float, float*,
                                           std::int64_t);

std::vector<std::int64_t> gather_token_counts(Communicator& group, std::int64_t tokens) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(group.size()));
  group.all_gather(&tokens, counts.data(), 1, DType::i64);
  return counts;
}

void check_targets(Device& dev, Communicator& group, const std::int32_t* device_targets, std::int64_t tokens,
                   std::int64_t vocab, const VocabLossOptions& o) {
  std::vector<std::int32_t> targets(static_cast<std::size_t>(std::max<std::int64_t>(tokens, 0)));
  copy_to_host(dev, targets.data(), device_targets, targets.size() * sizeof(std::int32_t));
  std::int64_t bad = -1;
  for (std::int64_t i = 0; i < tokens; ++i) {
    std::int32_t t = targets[static_cast<std::size_t>(i)];
    if (t != o.ignore_index && (t < 0 || t >= vocab)) {
      bad = i;
      break;
    }
  }
  std::int64_t any = bad >= 0 ? 1 : 0;
  group.all_reduce(&any, 1, DType::i64, ReduceOp::max);
  if (bad >= 0)
    throw InvalidArgument("target " + std::to_string(targets[static_cast<std::size_t>(bad)]) + " of token " + std::to_string(bad) +
                          " on rank " + std::to_string(group.rank()) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ") and is not ignore_index " + std::to_string(o.ignore_index));
  if (any) throw InvalidArgument("a target on another rank of the vocabulary group is outside the vocabulary");
}

}  // namespace peakbound
