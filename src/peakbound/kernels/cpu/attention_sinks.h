// Attention sinks (gpt-oss: a learned logit per query head that joins every softmax
// denominator and attends to nothing), as transformers' gpt-oss eager attention computes
// them: softmax over [scale q.k_j for the visible keys j, sink_h], the sink's column dropped.
//
// The sink is one more key with score sink_h (not scaled) and value 0, so it folds into the
// flash kernel's state (kernels/cpu/attention.h) after the last key block, and its backward
// is the kernel's own with that state:
//   forward   lse' = log(exp(lse) + exp(sink_h));  out' = out * exp(lse - lse')
//             (a row with no visible key, lse -inf: lse' = sink_h, out stays 0)
//   backward  attention_backward with out' and lse' gives dq, dk, dv unchanged in form
//             (P_ij = exp(S_ij - lse'_i) are the probabilities with the sink in the
//             denominator, D_i = rowsum(dout * out')); the sink's own column has dP = 0,
//             so dS_sink = -P_sink D_i and
//             dsink_h = -sum_i exp(sink_h - lse'[i, h]) D_i
//
// Shapes: out [T, Hq, Dv] f32 (the kernel's fp32 state), lse, row_dot [T, Hq], sinks [Hq].
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// out and lse READ and WRITTEN: the sinks merged into the finished rows (call it once, after
// the last key block).
void attention_sinks_forward(float* out, float* lse, const float* sinks, std::int64_t T, std::int64_t Hq,
                             std::int64_t Dv);

// dsinks [Hq] ADDED INTO (summed over the T rows of this call; over the sequence's blocks
// and a batch's sequences by calling again): lse the merged lse', row_dot D_i from the merged
// out' (attention_row_dot). Sums in double, stored in f32.
void attention_sinks_backward(float* dsinks, const float* lse, const float* row_dot, const float* sinks,
                              std::int64_t T, std::int64_t Hq);

}  // namespace peakbound::cpu
