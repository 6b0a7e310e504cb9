#include "peakbound/layers/mlp_footprint.h"

#include <algorithm>

#include "peakbound/layers/moe_layer.h"

namespace peakbound {

namespace {
using u64 = std::uint64_t;
u64 U(std::int64_t v) { return v > 0 ? static_cast<u64>(v) : 0; }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "MLP buffer size"); }
}  // namespace

MlpShape MlpShape::of(const ModelConfig& m, std::int64_t tokens, bool has_dense_layers, bool has_moe_layers) {
  MlpShape s;
  s.tokens = tokens;
  s.hidden = m.hidden_size;
  if (has_dense_layers) s.dense_ffn = m.dense_intermediate_size;
  if (has_moe_layers) {
    s.experts = m.num_experts;
    s.top_k = m.top_k;
    s.shared_ffn = m.shared_expert_width() * m.num_shared_experts;
  }
  return s;
}

Footprint mlp_footprint(const MlpShape& s, std::uint64_t a) {
  const u64 T = U(s.tokens);
  const Component L = Component::layer;
  const BufferSpec stream = buffer_spec(L, mul(T, U(s.hidden)), a);
  // The larger of the dense MLP's and the MoE layer's activations; the side SwiGLU's
  // (dense or shared) run over row tiles (MoeLayerConfig::side_tile).
  const std::int64_t tile_rows = moe_tile_rows(s.tokens, s.tile);
  const u64 R = U(side_ffn_tile_rows(tile_rows, kSideFfnTileRows)), Tt = U(tile_rows);
  const BufferSpec dense = buffer_spec(L, mul(R, U(s.dense_ffn)), a);
  const BufferSpec router = buffer_spec(L, mul(Tt, U(s.experts)), 4), topk = buffer_spec(L, mul(Tt, U(s.top_k)), 8),
                   shared = buffer_spec(L, mul(R, U(s.shared_ffn)), a);
  const u64 dense_bytes = mul(3, dense.reserved());
  const u64 moe_bytes = router.reserved() + topk.reserved() + mul(3, shared.reserved());
  Footprint f("mlp");
  f.device("residual", stream, 2);
  f.device("residual_forward", stream);       // the layer's output, which the MLP runs in place on
  f.device("residual_backward", stream, 3);  // + the incoming gradient
  for (const char* phase : {"forward", "backward"}) {
    const u64 copies = phase[0] == 'f' ? 1 : 2;
    // Forward: the stream in place, and the MoE layer's row tile of its input set aside.
    if (copies == 1) {
      f.device(phase, stream);
      if (s.experts > 0) f.device(phase, buffer_spec(L, mul(Tt, U(s.hidden)), a));
    } else {
      f.device(phase, stream, 3);  // + the incoming gradient
    }
    if (dense_bytes >= moe_bytes) {
      f.device(phase, dense, 3 * copies);
    } else {
      f.device(phase, router, copies).device(phase, topk, copies).device(phase, shared, 3 * copies);
    }
  }
  return f;
}

}  // namespace peakbound
