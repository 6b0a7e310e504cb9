// The model FLOPs of training one token, the numerator of model FLOP utilisation (MFU),
// counted the way PaLM's appendix B and Megatron-LM count them (docs/training.md):
//   6 N        N = the parameters a token multiplies by: ParamCount::active_non_embedding
//              (the embedding is a row lookup; the output head, the active experts, the
//              shared experts, the router and attention's projections are matmuls; the
//              norms' and biases' few elements are counted too, as the published counts do)
//   attention  per layer, 2 Hq (qk + v) flops per (query, visible key) pair forward (the
//              scores and the weighted values), times 3 for forward + backward: 6 Hq (qk + v)
//              x the mean number of keys a query sees: (S + 1) / 2 causal, and under a
//              window W the mean of min(i + 1, W) over the S positions.
// Recomputation (activation checkpointing, the attention backward's recomputed
// probabilities) is not counted: MFU counts the model's work, not the hardware's. Nor is
// the output head's work on a token without a target (ignore_index): its logits feed no
// loss and its gradient is zero, so the head's 6 V H counts for the scored tokens only
// (per_token(scored_fraction)); Ring-DTP does not compute it, the materialized loss
// does, uncounted like a recomputation.
#pragma once

#include <cstdint>

#include "peakbound/model/model_config.h"

namespace peakbound {

struct ModelFlops {
  double dense = 0;      // 6 N per token
  double attention = 0;  // the attention pairs' term per token, summed over the layers
  double head = 0;       // the output head's part of dense: 6 V H (0 when tied, as N counts it)
  double per_token() const { return dense + attention; }
  // Per input token of a step whose tokens are `scored_fraction` scored (in [0, 1]).
  double per_token(double scored_fraction) const { return dense - head * (1.0 - scored_fraction) + attention; }
};

// Throws InvalidArgument for an invalid config or seq_len < 1.
ModelFlops model_flops_per_token(const ModelConfig& c, std::int64_t seq_len);

// The mean number of keys a query of an S-token causal sequence sees (window 0: all before
// it and itself; window W: at most W).
double mean_visible_keys(std::int64_t seq_len, std::int64_t window);

}  // namespace peakbound
