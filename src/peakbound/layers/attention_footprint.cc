#include "peakbound/layers/attention_footprint.h"

namespace peakbound {

namespace {
using u64 = std::uint64_t;
u64 U(std::int64_t v) { return v > 0 ? static_cast<u64>(v) : 0; }
u64 mul(u64 a, u64 b) { return checked_mul(a, b, "attention buffer size"); }
}  // namespace

AttentionShape AttentionShape::of(const ModelConfig& m, std::int64_t tokens, std::int64_t cp) {
  AttentionShape s;
  s.tokens = tokens;
  s.hidden = m.hidden_size;
  s.heads = m.num_heads;
  s.kv_heads = m.num_kv_heads;
  s.qk_dim = m.qk_head_dim();
  s.v_dim = m.value_head_dim();
  s.latent = m.attention == AttentionKind::mla ? m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim : 0;
  s.cp = cp;
  return s;
}

AttentionBuffers attention_buffers(const AttentionShape& s, std::uint64_t a) {
  const u64 T = U(s.tokens);
  const Component C = Component::attention;
  AttentionBuffers b;
  b.x_norm = buffer_spec(C, mul(T, U(s.hidden)), a);
  b.q = buffer_spec(C, mul(T, mul(U(s.heads), U(s.qk_dim))), a);
  b.kv = buffer_spec(C, mul(T, mul(U(s.kv_heads), U(s.qk_dim) + U(s.v_dim))), a);
  b.o = buffer_spec(C, mul(T, mul(U(s.heads), U(s.v_dim))), a);
  b.latent = buffer_spec(C, mul(T, U(s.latent)), a);
  b.out = buffer_spec(C, mul(T, U(s.hidden)), a);
  b.lse = buffer_spec(C, mul(T, U(s.heads)), 4);
  b.kv_ring_slot = s.cp > 1 ? b.kv : BufferSpec{C, 0};
  return b;
}

Footprint attention_footprint(const AttentionShape& s, std::uint64_t elem_bytes) {
  const AttentionBuffers b = attention_buffers(s, elem_bytes);
  Footprint f("attention");
  for (const char* phase : {"forward", "backward"}) {
    const u64 copies = phase[0] == 'f' ? 1 : 2;  // backward: each tensor and its gradient
    for (const BufferSpec& x : {b.x_norm, b.q, b.kv, b.o, b.latent, b.out, b.lse}) f.device(phase, x, copies);
    f.device(phase, b.kv_ring_slot, 2 * copies);
  }
  return f;
}

}  // namespace peakbound
