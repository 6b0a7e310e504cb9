#include "peakbound/kernels/attention_dims.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {

void bad(const std::string& what) { throw InvalidArgument("attention: " + what); }

}  // namespace

float AttentionDims::effective_scale() const {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(qk_dim)));
}

void check_attention_dims(const AttentionDims& a) {
  if (a.tokens < 1) bad("tokens must be >= 1, got " + std::to_string(a.tokens));
  if (a.q_heads < 1 || a.kv_heads < 1)
    bad("q_heads and kv_heads must be >= 1, got " + std::to_string(a.q_heads) + ", " + std::to_string(a.kv_heads));
  if (a.q_heads % a.kv_heads != 0)
    bad("q_heads " + std::to_string(a.q_heads) + " is not a multiple of kv_heads " + std::to_string(a.kv_heads));
  if (a.qk_dim < 1 || a.v_dim < 1)
    bad("qk_dim and v_dim must be >= 1, got " + std::to_string(a.qk_dim) + ", " + std::to_string(a.v_dim));
  if (a.block_q < 1 || a.block_k < 1)
    bad("block_q and block_k must be >= 1, got " + std::to_string(a.block_q) + ", " + std::to_string(a.block_k));
  if (a.window < 0) bad("window must be >= 0 (0: none), got " + std::to_string(a.window));
  if (a.threads < 1) bad("threads must be >= 1, got " + std::to_string(a.threads));
  if (!std::isfinite(a.scale)) bad("scale must be finite");
  if (a.kv_tokens < 0) bad("kv_tokens must be >= 0 (0: tokens), got " + std::to_string(a.kv_tokens));
  if (a.q_offset < 0 || a.k_offset < 0)
    bad("q_offset and k_offset must be >= 0, got " + std::to_string(a.q_offset) + ", " + std::to_string(a.k_offset));
}

namespace {

// The floats of a bf16 tile of n elements (two a float, rounded up).
std::int64_t bf16_tile_floats(std::int64_t n, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    bad("workspace dtype must be f32 or bf16, got " + std::string(dtype_name(dtype)));
  return dtype == DType::bf16 ? (n + 1) / 2 : 0;
}

}  // namespace

std::int64_t attention_forward_workspace_floats(const AttentionDims& a, DType dtype) {
  const std::int64_t tile = a.block_q * a.block_k;
  return static_cast<std::int64_t>(a.threads) * (tile + 2 * a.block_q + bf16_tile_floats(tile, dtype));
}

std::int64_t attention_backward_workspace_floats(const AttentionDims& a, bool row_dot_given, DType dtype) {
  const std::int64_t tile = a.block_q * a.block_k;
  return (row_dot_given ? 0 : a.tokens * a.q_heads) +
         static_cast<std::int64_t>(a.threads) * 2 * (tile + bf16_tile_floats(tile, dtype));
}

std::int64_t attention_workspace_floats(const AttentionDims& a, DType dtype) {
  return std::max(attention_forward_workspace_floats(a, dtype), attention_backward_workspace_floats(a, false, dtype));
}

AttentionTiles attention_tiles(const AttentionDims& a) {
  check_attention_dims(a);
  const std::int64_t Tq = a.tokens, Tk = a.key_tokens(), Bq = a.block_q, Bk = a.block_k;
  AttentionTiles t;
  for (std::int64_t i0 = 0; i0 < Tq; i0 += Bq) {
    const TileRange r = attention_forward_keys(a, i0, std::min(i0 + Bq, Tq));
    for (std::int64_t j0 = r.lo / Bk * Bk; r.lo < r.hi && j0 < r.hi; j0 += Bk) ++t.forward;
  }
  for (std::int64_t j0 = 0; j0 < Tk; j0 += Bk) {
    const TileRange r = attention_backward_queries(a, j0, std::min(j0 + Bk, Tk) - j0);
    for (std::int64_t i0 = r.lo / Bq * Bq; r.lo < r.hi && i0 < r.hi; i0 += Bq) ++t.backward;
  }
  return t;
}

}  // namespace peakbound
