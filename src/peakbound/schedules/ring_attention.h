// Ring attention (issue 12): causal GQA self-attention of ONE sequence of S tokens split
// over a context-parallel group of CP ranks in the zigzag layout of
// schedules/context_layout.h. Rank r holds the tokens of zigzag_shard(S, CP, r) (its early
// chunk, then its late chunk, contiguous in that order) as q [T_r, Hq, D], k [T_r, Hkv, D],
// v [T_r, Hkv, Dv]; T_r = zigzag_shard(S, CP, r).tokens(). Positions are global: key j is
// visible to query i iff pos(j) <= pos(i) (and pos(i) - pos(j) < window when window > 0),
// exactly what cpu::attention_forward computes on the whole sequence.
//
// Forward: the K/V blocks (KV heads only) travel around the ring (RingExchange carried
// lanes, double-buffered, the next hop's transfer posted before the current block's
// compute); each rank folds every block into its queries' online softmax with the tiled
// kernel (cpu::attention_forward over (query chunk, key chunk) pairs at their global
// offsets, the query chunks cut into pieces of a few hundred rows so the transfers move
// between calls; pairs whose keys all lie after the queries are skipped, pairs whose
// keys all lie before run unmasked). out [T_r, Hq, Dv] and lse [T_r, Hq] are WRITTEN: the same
// values as the single-rank kernel on the whole sequence (to fp32 rounding).
// Backward: the K/V blocks travel again with their dK/dV accumulators (accumulated lanes);
// each rank recomputes its block's probabilities from the saved lse, adds into its own dq
// and into the travelling dK/dV; after the last hop every rank holds the complete dk, dv
// of its own tokens. dq, dk, dv are WRITTEN.
//
// Mixed precision (precision = bf16, the overloads below): q, k, v, dout and out (the
// forward's out narrowed once by the caller) are bf16 and so are the carried K/V lanes
// (kv_ring is half the f32 size); out and lse (forward) and dq, dk, dv (backward) are the
// caller's fp32 running states, and the travelling dK/dV accumulators, the block
// contribution and row_dot stay fp32: dk, dv are sums over the CP ranks, finished in fp32
// and narrowed once by the caller after the last hop. The workspaces are sized with
// DType::bf16.
//
// MLA's compressed form (latent > 0; the ring_attention_latent_* calls): what travels is
// not K and V of every head but what DeepSeek-V3's attention computes them from, per token
// the normalised latent c [latent] (kv_a_layernorm's output) and the shared rope key kr
// [rope] (rotated at its global position): latent + rope elements per token instead of
// Hkv x (qk + v). Each hop expands the block it holds through kv_b_proj (mla_expand_kv:
// kv = c Wkvb^T, K = [kv nope | kr for every head], V = kv's v part) into one K/V block
// buffer and runs the same kernel calls, so out and lse are those of the K/V form (to the
// rounding of the expansion's GEMM). The backward expands again, takes the block's dK/dV
// contribution of this rank's queries in fp32 and contracts it at once: dWkvb += d kv^T c
// (added into the caller's fp32 gradient: this rank's share, which the gradient reduction
// over the group completes), and d c = d kv Wkvb, d kr = the heads' dK rope columns
// summed, both fp32, travel the ring as the accumulated lanes. After the last hop every
// rank holds the complete dc, dkr of its own tokens (before kv_a_layernorm's and RoPE's
// backward, which stay the caller's). Needs kv_heads == q_heads. At cp 1 nothing travels
// but the keys still go in the call's pieces (piece_tokens): each piece's latent is
// expanded into the block buffer, its dK/dV from every query contracted at once into its
// rows of dc and dkr, so K and V of the whole sequence never exist (the MLA layer's
// single-device form for sequences longer than a piece).
//
// Memory: every internal buffer is allocated per call from the device (component
// attention) from ring_attention_buffers, so ring_attention_footprint is what a call
// holds. With CP == 1 nothing moves and the calls are the single-rank kernel's.
#pragma once

#include <cstdint>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/attention.h"

namespace peakbound {

class ThreadPool;

struct RingAttentionConfig {
  // Heads, head dims, scale, window, tiling and threads; dims.tokens is ignored (each call
  // takes its rank's shard length).
  AttentionDims dims;
  std::int64_t seq_len = 0;  // S: the whole sequence's tokens, >= 2 * CP (every chunk non-empty)
  Precision precision = Precision::f32;  // the dtype of q, k, v, dout, out and the carried lanes
  // MLA's compressed form (see above): kv_lora_rank and qk_rope_head_dim (the keys' last
  // `rope` columns; nope = qk_dim - rope). latent 0: K and V travel.
  std::int64_t latent = 0;
  std::int64_t rope = 0;
  // Backward: the caller passes D = rowsum(dout * out) [T_r, Hq] fp32 (ops::
  // attention_row_dot of its shard) through the backward's row_dot argument, so that it
  // can free out before the call: out is then not read (it may be null) and the call
  // holds no row_dot of its own (RingAttentionBuffers::row_dot is 0 bytes). false: row_dot
  // is null and the call computes D from out.
  bool given_row_dot = false;
  // The ring carries each shard in pieces of at most about piece_tokens tokens: the call
  // makes ring_attention_pieces(c, cp) = m passes round the ring, pass j carrying piece j
  // of every shard (the j-th of m near-equal parts of each of its two chunks, so every
  // pass keeps the zigzag's balance), so the travelling K/V slots, dK/dV accumulators and
  // (compressed form) the expanded block hold one piece instead of a shard. The same
  // bytes travel in m times as many messages; out, lse and dq gather over more kernel
  // calls (sums reordered: equal to the one-pass call to fp32 rounding, not bitwise).
  // 0: whole shards, one pass.
  std::int64_t piece_tokens = 0;
  // The queries of this call: piece query_piece of query_pieces of this rank's shard (cut
  // as the K/V pieces are: the j-th of m near-equal parts of each zigzag chunk, so every
  // rank of the group makes the same calls), packed: q, dout, out, lse and row_dot (and
  // the forward's out and lse, the backward's dq) hold those rows only, the piece's part
  // of the early chunk, then of the late one. K and V are the whole shard's, and the
  // backward ADDS its dk, dv into the caller's (zeroed before the first piece) when
  // query_pieces > 1. Every piece's call moves the whole K/V round the ring (query_pieces
  // times the traffic of one call over the shard). The K/V form only, cp > 1; at most the
  // shortest zigzag chunk (every part non-empty). 1: the whole shard.
  int query_pieces = 1;
  int query_piece = 0;
};

// The rows piece j of m takes of rank `rank`'s shard (RingAttentionConfig::query_pieces):
// its part of the early chunk at local row row0 and of the late chunk at row1, lengths n0
// and n1 (packed: rows [0, n0) of the piece, then [n0, n0 + n1)).
struct RingQueryRows {
  std::int64_t row0 = 0, n0 = 0, row1 = 0, n1 = 0;
  std::int64_t tokens() const { return n0 + n1; }
};
RingQueryRows ring_query_rows(std::int64_t seq_len, int cp, int rank, int m, int j);

// Throws InvalidArgument naming the first bad field (dims as check_attention_dims, S < 2 CP,
// piece_tokens < 0).
void check_ring_attention(const RingAttentionConfig& c, int cp);

// The passes a call makes (RingAttentionConfig::piece_tokens): ceil(widest shard /
// piece_tokens), at most the shortest zigzag chunk's tokens (every part non-empty); 1
// with piece_tokens 0 or (the K/V form) cp 1.
int ring_attention_pieces(const RingAttentionConfig& c, int cp);

// What one call holds on a rank of a CP group (sized for the largest shard's piece, so every rank
// of the group allocates the same): the travelling K/V double buffer, the travelling dK/dV
// accumulators and the block contribution they add (backward), rowsum(dout * out)
// (backward) and the kernel's tile workspace per pass. Zero bytes where CP == 1 needs none.
// The compressed form carries 2 slots x max piece x (latent + rope) in kv_ring, expands
// each block into `expand` (K and V of the block and kv_b_proj's output, activation dtype;
// the backward reuses the latter for d kv) with nn/linear's tile (bf16), and its dkv_ring
// holds the travelling d c | d kr (two slots and one contribution, fp32) and the block's
// dK/dV contribution (fp32). At cp 1 (compressed form) kv_ring is one packed piece (none
// with one piece) and dkv_ring the block's dK/dV contribution, then that piece's d c | d kr.
struct RingAttentionBuffers {
  BufferSpec kv_ring;            // forward and backward: 2 slots x max piece x Hkv x (D + Dv), activation dtype
  BufferSpec dkv_ring;           // backward: the travelling dK/dV (its slots) and one block's contribution
  BufferSpec expand;             // compressed form only: the expanded block, forward and backward
  BufferSpec tile;               // compressed form under bf16 only: the expansion's fp32 tile
  BufferSpec row_dot;            // backward: [T_r, Hq] f32 (0 bytes with given_row_dot)
  BufferSpec workspace_forward;  // kernel tiles
  BufferSpec workspace_backward;
};
RingAttentionBuffers ring_attention_buffers(const RingAttentionConfig& c, int cp);
// Phases "forward" and "backward" (component attention; q, k, v, out, lse, dout and the
// gradients are the caller's).
Footprint ring_attention_footprint(const RingAttentionConfig& c, int cp);

// Bytes one call's transfers send from rank `rank` of the group (the forward's carried
// lanes; the backward's carried and accumulated lanes): what RingAttentionStats::
// bytes_sent measures.
struct RingAttentionTraffic {
  std::uint64_t forward = 0;
  std::uint64_t backward = 0;
};
RingAttentionTraffic ring_attention_traffic(const RingAttentionConfig& c, int cp, int rank);
// The bytes every ring attention call of this process has sent so far (the sum of their
// bytes_sent): what a training step's rings moved is the difference across it.
std::uint64_t ring_attention_bytes_sent();

// The [Bq x Bk] score tiles per query head that rank `rank`'s kernel calls compute in one
// forward and in one backward (attention_tiles summed over the calls, which the ring makes
// through the same loop): under a window the chunk pairs with no visible key are not
// called, and inside a call the kernel skips the tiles outside the window.
AttentionTiles ring_attention_tiles(const RingAttentionConfig& c, int cp, int rank);

// Timing of one call, for `peakbound bench attention` (null: nothing is timed and the
// call adds no host task; give it on every rank of the group or on none: with CP > 1
// the timed call ends by passing its post times one hop round the ring).
//   wall_seconds     the call, entry to return (the compute stream synchronized).
//   compute_seconds  busy time of its kernel calls on the compute stream (timestamps
//                    taken by host tasks around each call, in stream order).
//   exposed_seconds  wall - compute: the time this rank was not computing.
//   wait_seconds     time blocked in the ring's waits once its own compute was done,
//                    split by when the previous rank posted the data waited for (the
//                    clocks of one host's processes agree):
//   imbalance_seconds     before the previous rank had posted it (it was still busy),
//   exposed_comm_seconds  after it had: the transfer's own time not hidden by compute.
//   communication_only (an input): skip every attention kernel call and move exactly
//                    the same buffers: the transfers' time with no compute to hide behind
//                    (the outputs are then meaningless).
struct RingAttentionStats {
  bool communication_only = false;
  double wall_seconds = 0.0;
  double compute_seconds = 0.0;
  double exposed_seconds = 0.0;
  double wait_seconds = 0.0;
  double imbalance_seconds = 0.0;
  double exposed_comm_seconds = 0.0;
  std::uint64_t bytes_sent = 0;  // the call's sends from this rank (ring_attention_traffic)
  double tick = 0.0;  // internal: the start of the kernel call the stream is running
};

// stats: see RingAttentionStats (null: untimed).
void ring_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out, float* lse,
                            const float* q, const float* k, const float* v, ThreadPool* pool = nullptr,
                            RingAttentionStats* stats = nullptr);
void ring_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* row_dot, ThreadPool* pool = nullptr,
                             RingAttentionStats* stats = nullptr);
// bf16 (c.precision must be bf16; the f32 forms above need f32): out, lse, dq, dk, dv fp32.
void ring_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out, float* lse,
                            const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool = nullptr,
                            RingAttentionStats* stats = nullptr);
void ring_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                             const bf16* out, const float* lse, const float* row_dot, ThreadPool* pool = nullptr,
                             RingAttentionStats* stats = nullptr);

// The compressed form (c.latent > 0; cp 1 too, see above). c_lat [T_r, latent] and kr [T_r, rope] are
// this rank's tokens' (kr rotated, in the keys' column order), wkvb kv_b_proj's weight
// [Hq x (nope + v), latent] of the activation dtype. Forward: out, lse as the K/V form's.
// Backward: dq, dc [T_r, latent] and dkr [T_r, rope] WRITTEN (fp32); dwkvb (fp32, [Hq x
// (nope + v), latent]) ADDED INTO with this rank's share of the weight's gradient.
void ring_attention_latent_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out,
                                   float* lse, const float* q, const float* c_lat, const float* kr, const float* wkvb,
                                   ThreadPool* pool = nullptr, RingAttentionStats* stats = nullptr);
void ring_attention_latent_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out,
                                   float* lse, const bf16* q, const bf16* c_lat, const bf16* kr, const bf16* wkvb,
                                   ThreadPool* pool = nullptr, RingAttentionStats* stats = nullptr);
void ring_attention_latent_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq,
                                    float* dc, float* dkr, float* dwkvb, const float* dout, const float* q,
                                    const float* c_lat, const float* kr, const float* wkvb, const float* out,
                                    const float* lse, const float* row_dot, ThreadPool* pool = nullptr,
                                    RingAttentionStats* stats = nullptr);
void ring_attention_latent_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq,
                                    float* dc, float* dkr, float* dwkvb, const bf16* dout, const bf16* q,
                                    const bf16* c_lat, const bf16* kr, const bf16* wkvb, const bf16* out,
                                    const float* lse, const float* row_dot, ThreadPool* pool = nullptr,
                                    RingAttentionStats* stats = nullptr);

// MLA's K and V from the latent, for `tokens` tokens (A = float | bf16): kv [tokens, Hq x
// (nope + v)] = c Wkvb^T through nn/linear (tile: its bf16 scratch, linear_tile_spec), then
// k [tokens, Hq, nope + rope] = [kv's nope | kr, the same for every head], v [tokens, Hq, v]
// = kv's v part. All WRITTEN. Shared by the attention layer (K/V form) and the ring's
// compressed form, so both expand the same way.
template <class A>
void mla_expand_kv(Device& dev, Stream& s, std::int64_t tokens, std::int64_t heads, std::int64_t latent,
                   std::int64_t nope, std::int64_t rope, std::int64_t v_dim, const A* c_lat, const A* kr,
                   const A* wkvb, A* k, A* v, A* kv, float* tile);

}  // namespace peakbound
