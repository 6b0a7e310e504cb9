// The attention layer's working set as a footprint (Component::attention): the spec
// the attention layer allocates from once it lands (the trainer's issue), and what the
// planner composes today. Flash-style: no [T, T] scores, only the per-head
// log-sum-exp kept for backward.
//   forward   x_norm [T, H], q [T, heads * d_qk], k|v [T, kv_heads * (d_qk + d_v)],
//             o [T, heads * d_v], the MLA latents [T, q_lora + kv_lora + rope] (MLA
//             only), out [T, H]; lse [T, heads] fp32; with context parallelism the
//             peers' K/V blocks, double-buffered around the ring.
//   backward  every forward tensor recomputed, plus its gradient (same shapes).
#pragma once

#include <cstdint>

#include "peakbound/core/footprint.h"
#include "peakbound/model/model_config.h"

namespace peakbound {

struct AttentionShape {
  std::int64_t tokens = 0;  // T on this device (after the context-parallel split)
  std::int64_t hidden = 0, heads = 0, kv_heads = 0, qk_dim = 0, v_dim = 0;
  std::int64_t latent = 0;  // MLA: q_lora_rank + kv_lora_rank + qk_rope_head_dim; 0 otherwise
  std::int64_t cp = 1;      // context-parallel ranks

  static AttentionShape of(const ModelConfig& m, std::int64_t tokens, std::int64_t cp);
};

struct AttentionBuffers {
  BufferSpec x_norm, q, kv, o, latent, out, lse, kv_ring_slot;
};

AttentionBuffers attention_buffers(const AttentionShape& s, std::uint64_t elem_bytes);
// Phases "forward" and "backward".
Footprint attention_footprint(const AttentionShape& s, std::uint64_t elem_bytes);

}  // namespace peakbound
