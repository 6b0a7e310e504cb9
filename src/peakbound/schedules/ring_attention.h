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
};

// Throws InvalidArgument naming the first bad field (dims as check_attention_dims, S < 2 CP).
void check_ring_attention(const RingAttentionConfig& c, int cp);

// What one call holds on a rank of a CP group (sized for the largest shard, so every rank
// of the group allocates the same): the travelling K/V double buffer, the travelling dK/dV
// accumulators and the block contribution they add (backward), rowsum(dout * out)
// (backward) and the kernel's tile workspace per pass. Zero bytes where CP == 1 needs none.
struct RingAttentionBuffers {
  BufferSpec kv_ring;            // forward and backward: 2 slots x max shard x Hkv x (D + Dv), activation dtype
  BufferSpec dkv_ring;           // backward: the travelling dK/dV (its slots) and one block's contribution
  BufferSpec row_dot;            // backward: [T_r, Hq] f32
  BufferSpec workspace_forward;  // kernel tiles
  BufferSpec workspace_backward;
};
RingAttentionBuffers ring_attention_buffers(const RingAttentionConfig& c, int cp);
// Phases "forward" and "backward" (component attention; q, k, v, out, lse, dout and the
// gradients are the caller's).
Footprint ring_attention_footprint(const RingAttentionConfig& c, int cp);

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
  double tick = 0.0;  // internal: the start of the kernel call the stream is running
};

// stats: see RingAttentionStats (null: untimed).
void ring_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out, float* lse,
                            const float* q, const float* k, const float* v, ThreadPool* pool = nullptr,
                            RingAttentionStats* stats = nullptr);
void ring_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, ThreadPool* pool = nullptr,
                             RingAttentionStats* stats = nullptr);
// bf16 (c.precision must be bf16; the f32 forms above need f32): out, lse, dq, dk, dv fp32.
void ring_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out, float* lse,
                            const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool = nullptr,
                            RingAttentionStats* stats = nullptr);
void ring_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq, float* dk,
                             float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                             const bf16* out, const float* lse, ThreadPool* pool = nullptr,
                             RingAttentionStats* stats = nullptr);

}  // namespace peakbound
