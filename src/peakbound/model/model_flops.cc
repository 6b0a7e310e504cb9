#include "peakbound/model/model_flops.h"

#include <algorithm>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/model/param_count.h"

namespace peakbound {

double mean_visible_keys(std::int64_t S, std::int64_t W) {
  if (S < 1) throw InvalidArgument("model flops: seq_len must be >= 1, got " + std::to_string(S));
  const double s = static_cast<double>(S);
  if (W <= 0 || W >= S) return (s + 1.0) / 2.0;
  // Rows 0 .. W-1 see i + 1 keys, the S - W after them W each.
  const double w = static_cast<double>(W);
  return (w * (w + 1.0) / 2.0 + (s - w) * w) / s;
}

ModelFlops model_flops_per_token(const ModelConfig& c, std::int64_t seq_len) {
  const ParamCount n = count_params(c);
  ModelFlops f;
  f.dense = 6.0 * static_cast<double>(n.active_non_embedding);
  f.head = 6.0 * static_cast<double>(n.lm_head);
  const double per_pair = 6.0 * static_cast<double>(c.num_heads) * static_cast<double>(c.qk_head_dim() + c.value_head_dim());
  for (std::int64_t l = 0; l < c.num_layers; ++l) f.attention += per_pair * mean_visible_keys(seq_len, c.attention_window(l));
  return f;
}

}  // namespace peakbound
