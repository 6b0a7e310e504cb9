// The activations around the MLP of a transformer layer as a footprint
// (Component::layer): the residual stream, the dense MLP or the MoE layer's router
// and shared experts (the routed experts' memory is the dispatch schedule's own
// footprint). The spec the trainer's layers allocate from once they land, and what
// the planner composes today.
//   residual  the stream's input and output [T, H] (the loss: its input and the normed hidden)
//   residual_forward   the layer's output [T, H] (the attention writes it, the MLP runs on it in place)
//   forward   the stream [T, H] in place; MoE: the row tile's input set aside [tile, H]; then
//             dense: gate, up, act [R, F_dense] (R: a row tile, MoeLayerConfig::side_tile); MoE: router logits [T, E] fp32,
//             top-k ids and weights [T, k] (8 bytes a pair), shared experts' gate, up,
//             act [R, shared_width * shared_experts]; the larger of the two kinds; with a
//             row tile the router's terms are the tile's rows

//   backward  the incoming gradient [T, H], the forward tensors and their gradients
#pragma once

#include <cstdint>

#include "peakbound/core/footprint.h"
#include "peakbound/model/model_config.h"

namespace peakbound {

struct MlpShape {
  std::int64_t tokens = 0, hidden = 0;
  std::int64_t dense_ffn = 0;  // 0 when no layer is dense
  std::int64_t experts = 0, top_k = 0, shared_ffn = 0;  // experts 0 when no layer is MoE
  std::int64_t tile = 0;  // the sublayers' row tile (MoeLayerConfig::seq_tile), 0: whole

  static MlpShape of(const ModelConfig& m, std::int64_t tokens, bool has_dense_layers, bool has_moe_layers);
};

// Phases "residual" (the loss's), "residual_forward" and "residual_backward" (what
// attention's phases hold: the stream, and in backward its incoming gradient), "forward",
// "backward" (both include the stream; backward also the incoming gradient).
Footprint mlp_footprint(const MlpShape& s, std::uint64_t elem_bytes);

}  // namespace peakbound
