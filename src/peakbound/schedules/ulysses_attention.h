// Ulysses attention (DeepSpeed-Ulysses sequence parallelism; issue 31): the second way to
// run causal GQA attention over a context-parallel group, beside the ring
// (schedules/ring_attention.h), with the ring's call contract so the attention layer can
// take either. Each rank holds its zigzag shard of the sequence (schedules/
// context_layout.h) with every head; an all-to-all over the group turns that into the
// whole sequence for a share of the heads, the single-rank kernel runs there, and a
// second all-to-all brings each rank its shard's rows of every head back. Nothing
// circulates: K and V cross the group once a call (a ring moves them cp - 1 hops).
//
// Heads: where cp divides Hkv, rank d takes KV heads d x hk .. d x hk + hk - 1 (hk = Hkv /
// cp) and the Hq / Hkv query heads of each, and the call goes one of its KV heads at a
// time (hk steps): step t exchanges each rank's columns of KV head d x hk + t (and its
// query heads) with rank d, so a rank holds K and V of ONE head for the whole sequence,
// [S, D] and [S, Dv], not its share of every head at once (ALST's head-tiled Ulysses).
// Where Hkv divides cp instead (more ranks than KV heads; cp must then divide Hq), rank d
// takes Hq / cp query heads, d x Hq / cp onwards, in one step, and the one KV head they
// read: every KV head goes to the cp / Hkv ranks sharing it (DeepSpeed-Ulysses' KV head
// replication), and their dK/dV are summed at the keys' owner. Elsewhere it is refused.
//
// Forward (step t): q (this call's query rows: the whole shard, or query piece j of m as
// the ring cuts it, RingAttentionConfig::query_pieces), k and v go to the heads' owners;
// the owner places K and V at their global positions (both zigzag chunks of every rank)
// and the queries packed by (chunk, source rank); the kernel runs once per received query
// run (rows at global offset p against keys 0 .. p + n - 1: one causal call, its window
// applied); the fp32 out and lse of the run go back to the queries' owner into the columns
// of those heads. out [P, Hq, Dv] and lse [P, Hq] are WRITTEN: the single-rank kernel's
// values (to fp32 rounding: a run's tiles start at its own first row).
// Backward (step t): q, k, v, dout, lse and D = rowsum(dout * out) (given, or computed
// here from out first) travel as in the forward; the kernel (accumulate mode, into fp32
// dq, dK, dV zeroed) runs per query run; dq goes back to the queries' owner, dK and dV to
// the keys' owners. dq is WRITTEN; dk, dv are WRITTEN with one query piece and ADDED INTO
// with several (like the ring's). bf16 (the overloads): q, k, v, dout, out bf16, and so
// their exchanges; out, lse, dq, dk, dv fp32 (the fp32 out and gradients cross back in
// fp32, so the caller narrows once, as after the ring).
//
// Memory (component attention, allocated per call from ulysses_attention_buffers, so the
// footprint is what a call holds): the gathered queries of a call (R rows = the call's
// rows over the group: S, or a piece's) for one KV head's query heads, K and V of one head
// [S, D + Dv], the fp32 out / lse (forward) or dq, dK, dV (backward) of those, and one
// staging buffer the exchanges pack into and receive into. K and V grow with S, not with
// S / cp: the ring's travelling K/V are bounded by its pieces instead, so the plan weighs
// the two (plan --context-attention auto).
//
// CPU device only (the exchanges pack columns with ops::copy_columns and call the
// communicator from the host). The K/V form only (no MLA latent).
#pragma once

#include <cstdint>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/footprint.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/ring_attention.h"

namespace peakbound {

class ThreadPool;

// How a context-parallel attention layer runs its attention (ModelSchedules::
// context_attention): the ring (K/V travel round the group) or Ulysses (heads split).
enum class ContextAttention : std::uint8_t { ring, ulysses };
const char* context_attention_name(ContextAttention a);

// Throws InvalidArgument naming the first bad field: the ring's checks (cp >= 1, S >= 2 cp,
// the dims, query pieces), latent == 0 and the heads (ulysses_refusal).
void check_ulysses_attention(const RingAttentionConfig& c, int cp);
// Whether Ulysses can split these heads over cp ranks (cp divides Hkv, or Hkv divides cp
// and cp divides Hq; never MLA's attention, whose context parallelism is its latent ring):
// empty when it can, else the one-line reason. The one rule the layer, train and plan apply.
std::string ulysses_refusal(std::int64_t q_heads, std::int64_t kv_heads, int cp, bool mla = false);

// What one call holds (every rank the same: sized for the widest call over the group's
// ranks and the call's pieces). Forward: stage, q, kv, out, lse, workspace_forward.
// Backward: stage, q, kv, d_o, lse_and_d, dq, dkv, workspace_backward and
// row_dot (this call's D when not given).
struct UlyssesAttentionBuffers {
  BufferSpec stage;     // the largest packed exchange (sends and receives in turn)
  BufferSpec q;         // [R, g x D] act: the gathered queries of a step's g query heads
  BufferSpec kv;        // [S, D + Dv] act: K and V of one KV head, the whole sequence
  BufferSpec out;       // [R, g x Dv] f32 (forward)
  BufferSpec lse;       // [R, g] f32 (forward)
  BufferSpec lse_and_d; // [R, 2 g] f32 (backward: lse, then D = rowsum(dout * out))
  BufferSpec d_o;       // [R, g x Dv] act (backward)
  BufferSpec dq;        // [R, g x D] f32 (backward)
  BufferSpec dkv;       // [S, D + Dv] f32 (backward)
  BufferSpec row_dot;   // [P, Hq] f32 (backward, not given_row_dot)
  BufferSpec workspace_forward, workspace_backward;
};
UlyssesAttentionBuffers ulysses_attention_buffers(const RingAttentionConfig& c, int cp);
// Phases "forward" and "backward" (component attention).
Footprint ulysses_attention_footprint(const RingAttentionConfig& c, int cp);

// Bytes one call's exchanges send from rank `rank` of the group (every destination but
// itself): forward q, k, v out and out, lse back; backward q, k, v, dout, lse, D out and
// dq, dk, dv back.
RingAttentionTraffic ulysses_attention_traffic(const RingAttentionConfig& c, int cp, int rank);

// The bytes every Ulysses call of this process has sent to other ranks so far (what
// ulysses_attention_traffic counts, summed): a training step's is the difference across it.
std::uint64_t ulysses_attention_bytes_sent();

// The ring's signatures (schedules/ring_attention.h); pool: the kernel's shares.
void ulysses_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out,
                               float* lse, const float* q, const float* k, const float* v,
                               ThreadPool* pool = nullptr);
void ulysses_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq,
                                float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* out, const float* lse, const float* row_dot,
                                ThreadPool* pool = nullptr);
void ulysses_attention_forward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* out,
                               float* lse, const bf16* q, const bf16* k, const bf16* v, ThreadPool* pool = nullptr);
void ulysses_attention_backward(Device& dev, Communicator& cp_group, const RingAttentionConfig& c, float* dq,
                                float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                const bf16* out, const float* lse, const float* row_dot, ThreadPool* pool = nullptr);

}  // namespace peakbound
