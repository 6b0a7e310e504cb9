// The exactness harness of the vocabulary loss, shared by the tests, `verify vocab`
// and `bench vocab`: a deterministic problem that every rank can generate whole
// (so a naive single-process reference needs no communication), the naive double-
// precision reference, and one run of a VocabLoss compared against it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "peakbound/core/buffer.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

struct VocabProblemSpec {
  std::vector<std::int64_t> tokens;  // per rank
  std::int64_t hidden = 0, vocab = 0;
  double ignore_fraction = 0.0;      // share of targets set to ignore_index
  int all_ignored_rank = -1;         // this rank gets only ignore_index targets
  std::uint64_t seed = 1;
};

// The whole group's data: rank r's tokens start at row offset(r).
struct VocabProblem {
  VocabProblemSpec spec;
  std::vector<float> hidden;         // [sum T, H]
  std::vector<std::int32_t> targets; // [sum T]
  std::vector<float> weight;         // [V, H], all shards
  std::int64_t offset(int rank) const;
};
VocabProblem make_vocab_problem(const VocabProblemSpec& spec, std::int32_t ignore_index);

// Naive reference in double precision over the whole problem: summed loss over
// valid tokens, count, dHidden [sum T, H] and dW [V, H] of scale x summed loss.
struct VocabReference {
  double loss = 0;
  std::int64_t count = 0;
  std::vector<float> d_hidden, d_weight;
};
VocabReference naive_vocab_reference(const VocabProblem& p, const VocabLossOptions& o, float scale);

// One rank's vocabulary-loss inputs and gradients in device memory, as a model holds
// them: hidden [T, H] and targets [T] (Component::layer), its weight shard [rows, H]
// (params), d_hidden [T, H] (layer, uninitialised) and d_weight [rows, H] (grads,
// uninitialised). Every buffer holds at least one element, so no pointer is null. Under
// bf16 hidden, weight and d_hidden are bf16 (hidden and weight rounded once from the
// given floats), as the loss's bf16 entry points take them; targets and d_weight stay
// 4-byte.
struct VocabRankOnDevice {
  VocabRankOnDevice(Device& dev, const float* hidden, const std::int32_t* targets, std::int64_t tokens,
                    std::int64_t H, const float* weight, std::int64_t rows, Precision p = Precision::f32);
  // The device bytes it allocates (each buffer as the Arena reserves it).
  static std::uint64_t bytes(std::int64_t tokens, std::int64_t H, std::int64_t rows, Precision p = Precision::f32);
  // The first n elements of d_hidden on the host, as floats (bf16 widened).
  std::vector<float> d_hidden_floats(Device& dev, std::int64_t n) const;

  Precision precision;
  Buffer hidden, targets, weight, d_hidden, d_weight;
};

// One forward + backward of `impl` on this rank's slice, compared with the reference;
// `between` (if set) runs after forward and before backward (tests measure there).
struct VocabCheck {
  double rel_err_loss = 0;     // of the group's summed loss
  double rel_err_dhidden = 0;  // max over ranks, max|a-ref|/max|ref| over the tensor
  double rel_err_dweight = 0;
  std::int64_t count = 0;      // the group's valid tokens
  bool count_matches = false;
};
VocabCheck check_vocab_loss(VocabLoss& impl, Communicator& group, const VocabProblem& p,
                            const VocabReference& ref, float scale, const std::function<void()>& between = {});
// The same through impl.forward_backward (the fused form where Ring-DTP takes it). dW
// starts at `dw_start` everywhere and the start is taken off before comparing, so a
// form that writes dW instead of adding into it fails.
VocabCheck check_vocab_loss_step(VocabLoss& impl, Communicator& group, const VocabProblem& p,
                                 const VocabReference& ref, float scale, float dw_start = 0.125f);

}  // namespace peakbound
