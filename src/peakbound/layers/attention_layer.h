// AttentionLayer: the attention sublayer of a Qwen3-MoE / Mixtral / gpt-oss decoder layer
// as transformers computes it (Qwen3MoeAttention / MixtralAttention / GptOssAttention with
// the decoder layer's pre-norm and residual), f32 or bf16 (config.precision), through ops::
// on the device's compute stream:
//   h = rmsnorm(x) * w_in                               (input_layernorm)
//   q = h Wq^T + bq [T, Hq*D], k = h Wk^T + bk, v = h Wv^T + bv [T, Hkv*D]
//                                                       (nn.Linear; biases with qkv_bias)
//   qk_norm (Qwen3): q, k = rmsnorm over each head's D * q_norm / k_norm, before RoPE
//   q, k = rope(q, k, positions 0 .. T-1, theta)        (rotate_half)
//   o = causal GQA attention(q, k, v), scale D^-0.5, within `window` keys when window > 0,
//       each head's sink logit in its softmax denominator with sinks (gpt-oss)
//   y = x + bo + o Wo^T                                 (o_proj [H, Hq*D]; bo with out_bias)
// A bias is every row of the output before the product adds in (bf16: one rounding for
// q, k, v), and the gradients are column sums of the upstream gradient.
// A call takes T = B x S tokens: B whole sequences of seq_len S each, one after the
// other (seq_len 0: the call is one sequence of T). Positions restart at 0 in every
// sequence and no token attends across a sequence boundary; the projections run over
// all T rows at once. Context parallel (cp > 1, the group given by set_cp_group): each
// sequence of S tokens is split over the cp ranks in the zigzag layout
// (schedules/context_layout.h), a call takes B x T_r tokens, this rank's shard of each
// of the B sequences (T_r = zigzag_shard(S, cp, cp_rank).tokens()), RoPE rotates them
// at their global positions and attention is ring attention over the group
// (schedules/ring_attention.h): the result is the rows of the cp = 1 layer's.
// Mixed precision (config.precision = bf16, docs/precision.md): x, y, dx, dy, h, q, k, v,
// q_pre, k_pre, o, d_o, dq, dk, dv and the parameters are bf16; the parameter gradients,
// rstd, q/k_rstd, the RoPE tables, lse and the kernel workspace stay fp32. Every activation
// product goes through nn/linear (one rounding per sum): q/k/v = h W^T, d_o = dy Wo,
// dh = dq Wq + dk Wk + dv Wv, and y = x + o Wo^T in add mode (x widened, rounded once).
// The weight gradients are ops::gemm_bf16 with beta 1 straight into the fp32 gradients.
// Attention keeps fp32 running states: at cp = 1 the queries of each sequence go through
// the kernel in chunks of kAttentionChunkRows rows (against the keys they can see), each
// chunk's fp32 out / dq narrowed once into o / dq; dk, dv accumulate over the chunks in
// fp32 [S, 2 Hkv D] and are narrowed once after the last. Under cp > 1 the ring's fp32
// out / dq / dk / dv cover this rank's whole shard (schedules/ring_attention.h).
// Queries in pieces (GQA, attention_query_pieces > 1: a sequence's rows on this rank past
// piece_tokens): k and v are projected a row tile at a time and stay whole, q is projected
// a query piece at a time from x and never whole; the forward runs the kernel (or one ring
// call) per piece into the whole o and lse, the backward runs o_proj's backward and D a
// piece at a time, then per piece the kernel (or a ring call, which ADDS into the whole dk,
// dv) and RoPE's, the q norm's, q_proj's and input_layernorm's backward into dx (linear in
// dq row by row), then the keys' side a row tile at a time. The sums of dWq, dWk, dWv,
// dw_in, dk and dv and of dx's norm term (split in the q and the k/v parts) reorder: equal
// to the whole call to fp32 rounding.
// Parameters are views into memory the caller owns
// (a parameter store); backward recomputes everything from x (activation
// checkpointing), writes dx and ADDS into the parameter gradients. Every internal
// buffer is allocated per call (component attention) from attention_layer_buffers.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/buffer.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/model/rope_scaling.h"
#include "peakbound/nn/block.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound {

// Under cp > 1 the ring carries K/V (and, in backward, the dK/dV accumulators) in pieces
// of at most about this many tokens (RingAttentionConfig::piece_tokens): a shard of up to
// this many travels whole, a longer one in ceil(shard / this) passes round the ring, so
// the ring's travelling buffers stop growing with the context (f32 tiny-moe: 2.5 KB a
// local token, 5 MiB a piece). 2048 keeps each kernel call's key block about a thousand
// rows (a piece has two parts) and each message a few MiB.
inline constexpr std::int64_t kRingPieceTokens = 2048;

// The sublayer's sizes (from the HF config: hidden_size, num_attention_heads,
// num_key_value_heads, head_dim, rope_theta and YaRN's rope scaling, rms_norm_eps; qk_norm
// for Qwen3).
struct AttentionLayerConfig {
  std::int64_t hidden = 0;    // H
  std::int64_t q_heads = 0;   // Hq
  std::int64_t kv_heads = 0;  // Hkv, divides Hq
  std::int64_t head_dim = 0;  // D, even (RoPE)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;   // YaRN (model/rope_scaling.h); default: plain RoPE
  float rms_eps = 1e-6f;
  bool qk_norm = false;
  // gpt-oss's attention: biases on q/k/v_proj and on o_proj, a learned sink logit per
  // query head joining every softmax denominator (kernels/cpu/attention_sinks.h), and a
  // sliding window of `window` keys including the query's own (transformers'
  // sliding_window; 0: full causal). Biases and sinks have CPU kernels only so far.
  bool qkv_bias = false;
  bool out_bias = false;
  bool sinks = false;
  std::int64_t window = 0;
  // DeepSeek-V3's multi-head latent attention (DeepseekV3Attention; head_dim unused,
  // kv_heads == q_heads, neither qk_norm nor sinks):
  //   q   = q_lora_rank > 0 ? rmsnorm(h Wqa^T + bqa) Wqb^T : h Wq^T     [T, Hq, nope + rope]
  //   ckv = h Wkva^T + bkva  [T, kv_lora_rank + rope]: c = rmsnorm(ckv[:, :R]), k_rot = ckv[:, R:]
  //   kv  = c Wkvb^T [T, Hq, nope + v]: k = [kv nope | rope(k_rot), the same for every head],
  //         v = kv[..., nope:]; q = [q nope | rope(q rot)]
  // RoPE rotates the last qk_rope_dim columns only (rope_interleave: DeepSeek's interleaved
  // pairs, taken apart to rotate_half's halves first, as transformers'
  // apply_rotary_pos_emb_interleave); the norms' epsilon is kMlaNormEps (transformers
  // builds them with its default); the scores are scaled by softmax_scale (0: qk^-0.5;
  // DeepSeek's YaRN multiplies it by mscale^2). qkv_bias puts the biases on q_a_proj and
  // kv_a_proj_with_mqa. CPU kernels only so far.
  bool mla = false;
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_dim = 0, qk_rope_dim = 0, v_dim = 0;
  bool rope_interleave = true;
  float softmax_scale = 0.0f;
  // Under cp > 1 MLA's ring circulates the latent and the rope key (latent + rope per
  // token, expanded through kv_b_proj at every hop: ring_attention_latent_*) instead of
  // every head's K and V; false: K and V travel (what a GQA layer does).
  bool mla_latent_ring = true;
  // Tokens of a piece: the ring's K/V pieces under cp > 1 and the backward's query pieces
  // (attention_query_pieces); 0: whole shards and sequences (tests take small pieces).
  std::int64_t piece_tokens = kRingPieceTokens;
  // The output projection's row tile: y = x + o Wo^T is computed output_rows rows at a
  // time from row 0 (0: all rows at once), by forward and forward_rows alike, so the rows
  // a decoder layer's MLP tiles take have the forward's bits whatever the GEMM does with
  // its row count (forward_rows' ranges are whole tiles).
  std::int64_t output_rows = 0;
  // The attention's output o [T, O] on the host, not the device, between the kernel that
  // writes it and its readers (GQA with query pieces only, attention_output_on_host; no
  // effect otherwise): the forward's kernel puts each query piece's rows there, o_proj reads
  // it back an output_rows tile at a time (forward, forward_rows), and o_proj's backward
  // (dWo and D, a query piece at a time, before k and v are projected again) a piece at a
  // time. The same bits as on the device: the same operations on the same values. Needs
  // set_output_host; not with keep-through (every layer's o would share one host area).
  bool output_on_host = false;
  std::int64_t seq_len = 0;   // S: tokens per sequence; 0 = each call is one sequence
  int cp = 1;                 // context-parallel ranks (cp > 1: calls need seq_len >= 2 cp)
  // How attention runs under cp > 1: the ring (K/V travel round the group), or Ulysses
  // (schedules/ulysses_attention.h: the heads split over the group by all-to-all; GQA with
  // cp dividing kv_heads). The same results to fp32 rounding; the footprint and the
  // traffic differ.
  ContextAttention context_attention = ContextAttention::ring;
  int cp_rank = 0;            // this rank's place in the context-parallel group
  Precision precision = Precision::f32;  // the activations' and parameters' dtype
  // The CPU attention kernel's shares (AttentionDims::threads): its workspace holds one
  // slot each (the footprint counts them), and on the CPU device the ops run them on a pool
  // of that many threads, the BLAS on one thread meanwhile (ops/attention.h). The same bits
  // for every count. ModelSchedules::attention_threads sets it for a run: the rank's cores.
  int threads = 1;
};

// The epsilon of MLA's q_a_layernorm and kv_a_layernorm (DeepseekV3RMSNorm's default;
// transformers does not pass rms_norm_eps to them).
inline constexpr float kMlaNormEps = 1e-6f;

// Query rows per attention kernel call under bf16 at cp = 1 (a constant, so bf16 results
// do not depend on the schedule; a multiple of the kernel's 64-row tiles).
inline constexpr std::int64_t kAttentionChunkRows = 256;

// Tokens of one sequence a call holds on this rank: seq_len, or the zigzag shard's under cp.
std::int64_t attention_local_seq_len(const AttentionLayerConfig& c);

// The backward's query pieces per sequence (GQA and sinks; MLA: 1): under cp > 1 the ring's
// passes (RingAttentionConfig::piece_tokens = c.piece_tokens: the same on every rank of
// the group), at cp = 1 ceil(S / piece_tokens) pieces of piece_tokens rows (the default
// kRingPieceTokens is a multiple of kAttentionChunkRows, so bf16's chunks are those of the
// whole sequence); 1 with piece_tokens 0. The
// backward then holds the query side (d_o, dq) one piece at a time; each piece under cp > 1
// makes its own ring call, the whole K/V travelling once a piece.
int attention_query_pieces(std::int64_t tokens, const AttentionLayerConfig& c);

// Query piece i of m of a sequence's S rows on this rank: under cp > 1 the ring's
// (ring_query_rows: its parts of the two zigzag chunks), at cp = 1 rows [i P, min((i + 1) P,
// S)) of P = piece_tokens. Up to two runs (local row, count), packed in that order.
struct AttentionPieceRows {
  std::int64_t row[2] = {0, 0}, n[2] = {0, 0};
  std::int64_t tokens() const { return n[0] + n[1]; }
  // f(row, n, at) for each non-empty run in order: its first local row, its rows, and where
  // it starts in the packed piece.
  template <class F>
  void for_each_run(F&& f) const {
    for (int u = 0, at = 0; u < 2; at += static_cast<int>(n[u]), ++u)
      if (n[u] > 0) f(row[u], n[u], static_cast<std::int64_t>(at));
  }
};
AttentionPieceRows attention_piece_rows(std::int64_t S, int m, int i, const AttentionLayerConfig& c);

// Whether a call on `tokens` tokens keeps o on the host: c.output_on_host and the queries go
// in pieces (attention_query_pieces > 1).
bool attention_output_on_host(std::int64_t tokens, const AttentionLayerConfig& c);
// The host bytes such a call's o takes ([T, O] of the activation dtype; 0 when o stays on
// the device).
std::uint64_t attention_output_host_bytes(std::int64_t tokens, const AttentionLayerConfig& c);

// Throws InvalidArgument naming the first bad field.
void check_attention_layer_config(const AttentionLayerConfig& c);

// Views of the parameters (param_dtype(precision)) or of their gradients (f32 always) on the layer's device, in
// nn.Linear layout (out x in): w_in [H], wq [Hq*D, H], wk, wv [Hkv*D, H], wo [H, Hq*D],
// q_norm, k_norm [D] (left empty without qk_norm), bq [Hq*D], bk, bv [Hkv*D] (qkv_bias),
// bo [H] (out_bias), sinks [Hq] (sinks). MLA (qk = nope + rope, Rq = q_lora_rank, Rkv =
// kv_lora_rank): w_in, wo [H, Hq*v], bo; wq [Hq*qk, H] without q_lora_rank, else wqa [Rq, H],
// q_a_norm [Rq], wqb [Hq*qk, Rq]; wkva [Rkv + rope, H], kv_a_norm [Rkv], wkvb [Hq*(nope + v),
// Rkv]; with qkv_bias bqa [Rq] (q_lora_rank only) and bkva [Rkv + rope]. wk, wv unused.
struct AttentionLayerTensors {
  Tensor w_in, wq, wk, wv, wo, q_norm, k_norm, bq, bk, bv, bo, sinks;
  Tensor wqa, bqa, q_a_norm, wqb, wkva, bkva, kv_a_norm, wkvb;
};

// One call's internals on T tokens (component attention). Forward: h [T, H], rstd [T],
// q [T, Hq*D], k, v [T, Hkv*D], q_pre [T, Hq*D] and k_pre [T, Hkv*D] (the projections
// before the q/k norm, its input kept for backward) and q_rstd [T, Hq], k_rstd [T, Hkv]
// (qk_norm only, else 0 bytes), rope_cos, rope_sin [S, D/2] (one sequence's: every
// sequence uses the same positions), o [T, Hq*D], lse [T, Hq] (f32 whatever elem_bytes),
// workspace_forward (the attention kernel's for one sequence, f32, reused sequence after
// sequence; under cp > 1 none: the ring attention call allocates its own,
// ring_attention_footprint, which the layer's footprint adds). h and rstd live only
// through the projections: the kernel runs without them, and the backward recomputes
// them from x for the projections' backward (rmsnorm is deterministic: the same bits).
// Backward: d_o [T, Hq*D] and row_dot [T, Hq] f32 = rowsum(d_o * o), after which o is
// freed (the kernel reads D from row_dot, workspace_backward sized for a given D); dq
// [T, Hq*D], dk, dv [T, Hkv*D] through the kernel; then h and rstd again for the
// projections' backward, with dq/dk before the q/k norm going into q and k's buffers
// and dh into h's.
// bf16 only (0 bytes under f32): tile, nn/linear's fp32 tile [min(T, 256), max(H, Q, K)]
// (forward and backward); o32 [R, Q] fp32, the kernel's out of R query rows (the
// forward's kernel); dq32 [R, Q] and dkv32 [S_r, 2 K] fp32 (the backward's kernel). R =
// min(S, kAttentionChunkRows) at cp = 1, S_r (the shard) under cp > 1. The workspaces are
// sized for R rows and DType::bf16 under bf16.
// Sinks only (else 0 bytes): sinks32 [Hq] f32, the sink logits widened (forward and
// backward; their gradient reads lse and row_dot).
// MLA only (else 0 bytes): forward and backward hold qa, qa_n [T, Rq] (act) and qa_rstd [T]
// (q_lora_rank only), ckv [T, Rkv + rope], c_pre, c [T, Rkv], kr [T, rope], kv [T, Hq*(nope
// + v)], qr [T, Hq*rope] (act) and c_rstd [T]; q and k are [T, Hq*(nope + rope)], v and o
// [T, Hq*v]. Backward adds dc [T, Rkv] (act) and dkr32 [T, rope] f32 (k_rot's gradient
// summed over the heads) from the kernel on, and dqa [T, Rq] (act, q_lora_rank only) in
// the projections' backward; it reuses kv for d kv, ckv for d ckv, c for d c_pre and qa_n
// for d qa. With the latent ring (cp > 1 and mla_latent_ring) K and V are never formed on
// the layer: k, v, kv, dk and dv are 0 bytes (the ring expands each block itself), the
// ring writes dc and dkr32, and under bf16 dkv32 is the ring's fp32 dc [S_r, Rkv]
// (narrowed into dc).
// Query pieces (GQA; query_pieces > 1 once a sequence's rows on this rank pass
// piece_tokens, see attention_query_pieces): the forward and the backward take their
// queries a piece at a time (P = piece_rows, this rank's widest piece): h and rstd are
// h_piece [P, H], rstd_piece [P] (the projections run a row tile or a piece at a time),
// q is q_piece [P, Q] (q_pre_piece, q_rstd_piece with qk_norm), never whole (h, rstd, q,
// q_pre and q_rstd are not allocated); under cp > 1 o_piece [P, O] (act), lse_piece,
// row_dot_piece [P, Hq] f32 hold the piece's rows packed for the ring and o32 / dq32 are
// [P, width] (bf16); d_o and dq hold one piece. o, lse, k, v, dk and dv stay whole.
// Output on the host (attention_output_on_host): o is on the host; o_piece [P, O] holds a
// piece's rows at cp = 1 too (on their way to the host) and o_tile [R, O] (act; R =
// min(T, output_rows), T without output_rows) the rows o_proj reads back a tile at a time;
// o_proj's backward brings one piece of o back at a time into o_piece (no whole o on the
// device at all).
struct AttentionLayerBuffers {
  BufferSpec h, rstd, q, k, v, q_pre, k_pre, q_rstd, k_rstd, rope_cos, rope_sin, o, lse;
  int query_pieces = 1;
  std::int64_t piece_rows = 0;
  bool output_on_host = false;
  BufferSpec o_tile{};
  BufferSpec q_piece{}, q_pre_piece{}, q_rstd_piece{}, o_piece{}, lse_piece{}, row_dot_piece{}, h_piece{},
      rstd_piece{};
  BufferSpec workspace_forward, workspace_backward;
  BufferSpec d_o, dq, dk, dv;
  BufferSpec tile, o32, dq32, dkv32;
  BufferSpec sinks32, row_dot;
  BufferSpec qa{}, qa_n{}, qa_rstd{}, ckv{}, c_pre{}, c{}, c_rstd{}, kr{}, kv{}, qr{};
  BufferSpec dqa{}, dc{}, dkr32{};
};
// The specs of c.precision. The elem_bytes form sizes the activations at elem_bytes
// (the planner's estimate; the bf16-only specs follow c.precision).
AttentionLayerBuffers attention_layer_buffers(std::int64_t tokens, const AttentionLayerConfig& c);
AttentionLayerBuffers attention_layer_buffers(std::int64_t tokens, const AttentionLayerConfig& c,
                                              std::uint64_t elem_bytes);

// Phases (component attention only; parameters and their gradients belong to the
// parameter store's footprint): "forward project" (the projections: h, rstd, q, k, v, o,
// lse), "forward" (the kernel: h freed, its workspace; the ring's under cp), "backward
// output" (o_proj's backward: d_o and row_dot beside o), "backward" (the kernel: o freed,
// d_o, row_dot, dq, dk, dv, its workspace; the ring's under cp) and "backward project"
// (the projections' backward: h again, dq, dk, dv), plus "kept" (forward_for_backward's
// o and lse, held between calls; o on the host: lse and an o_tile) and "rows" (kept and a
// forward_rows call's linear tile).
// A forward call peaks at the larger of its two phases; a backward call at the largest of
// the other four, and of "forward" too unless it takes what forward_for_backward kept (its
// recomputation then runs no kernel).
// Query pieces (GQA): a backward runs o_proj's backward ("backward output": o, lse, D and
// a piece's d_o) before k and v are projected ("kept project": k, v beside lse and D, no
// o); without a kept o it runs both forward phases first. Output on the host adds "forward
// output" (o_proj reading o back a tile at a time beside k, v and lse). attention_call_phases
// lists what each call reaches.
Footprint attention_layer_footprint(std::int64_t tokens, const AttentionLayerConfig& c);
Footprint attention_layer_footprint(std::int64_t tokens, const AttentionLayerConfig& c, std::uint64_t elem_bytes);
// The forward's phases (the projections', then the kernel's) and the backward's own
// (o_proj's, the kernel's, the projections'), in the order a call reaches them. A
// recomputation that takes the o and lse forward_for_backward kept runs its projections
// beside them (kAttentionKeptProjectPhase) instead of both forward phases.
inline constexpr std::array<std::string_view, 2> kAttentionForwardPhases = {"forward project", "forward"};
inline constexpr std::string_view kAttentionKeptProjectPhase = "kept project";
inline constexpr std::string_view kAttentionForwardOutputPhase = "forward output";
inline constexpr std::string_view kAttentionRowsPhase = "rows";
inline constexpr std::array<std::string_view, 3> kAttentionBackwardPhases = {"backward output", "backward",
                                                                             "backward project"};

// The calls whose phases attention_call_phases lists: forward (and forward_for_backward),
// forward_for_rows, a forward reusing what keep-through kept, forward_rows, a backward that
// recomputes the forward, and one that takes a kept o and lse.
enum class AttentionCall { forward, forward_for_rows, forward_reusing_kept, rows, backward, backward_taking_kept };
// The footprint phases (attention_layer_footprint) a call on `tokens` tokens reaches: it
// peaks at their largest.
std::vector<std::string_view> attention_call_phases(std::int64_t tokens, const AttentionLayerConfig& c,
                                                    AttentionCall call);

// Host memory for the o of layers with output_on_host: one area shared by the layers of a
// model (they run one after another on the device's compute stream), grown to the largest
// call's attention_output_host_bytes. Growing synchronizes the device first (no copy is in
// flight into the area it frees).
class AttentionOutputHost {
 public:
  explicit AttentionOutputHost(Allocator& host) : host_(host) {}
  // An area of at least `bytes` (component attention on the host).
  void* reserve(Device& dev, std::uint64_t bytes);
  // Frees the area (the device synchronized first).
  void release(Device& dev);
  std::uint64_t bytes() const { return area_.bytes(); }

 private:
  Allocator& host_;
  Buffer area_;
};

class AttentionLayer final : public Block {
 public:
  // params and grads: views as AttentionLayerTensors says (checked; InvalidArgument on
  // a wrong shape or dtype). The layer does not own them.
  AttentionLayer(Device& dev, const AttentionLayerConfig& config, const AttentionLayerTensors& params,
                 const AttentionLayerTensors& grads);

  // x, y [T, H] of the activation dtype; y may be x (in place: the output is added into
  // the input once the projections have read it, the same bits).
  void forward(const Tensor& x, const Tensor& y) override;
  bool forward_in_place() const override { return true; }
  // Writes dx [T, H] (not aliasing x; dx may be dy itself: in place), adds into every
  // parameter gradient.
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  bool backward_in_place() const override { return true; }
  // The forward, keeping the attention's output o and log-sum-exp for the next backward
  // on the same x, whose recomputation then runs the projections, norms and RoPE but not
  // the attention kernel (or the ring) again: one attention forward per layer in a
  // checkpointed backward, not two. o and lse stay held (footprint phase "kept") until
  // that backward or the next forward.
  void forward_for_backward(const Tensor& x, const Tensor& y) override;
  // forward_for_backward without y (footprint phase "rows" while the kept o and lse are
  // held: what a backward's rows need): forward_rows(x, first, rows, y) then writes y's
  // rows [first, first + rows) = x + o Wo^T (+ bias) from the kept o, the same bits as
  // the whole forward, under a linear tile of the whole call's (bf16) per call; until this
  // layer's backward on x (or the next forward). InvalidArgument without a kept o of x,
  // rows outside [0, T) or a range that is not whole output_rows tiles.
  bool forward_by_rows() const override { return true; }
  void forward_for_rows(const Tensor& x) override;
  void forward_rows(const Tensor& x, std::int64_t first, std::int64_t rows, void* y) override;
  // Keep-through (ModelSchedules::keep_attention): forward keeps o and lse too, from a
  // checkpointed stack's forward to this layer's backward, and forward_for_backward takes
  // what forward kept instead of running the attention kernel (or the ring) again: no
  // attention forward in the backward at all, for o and lse held per layer (footprint
  // phase "kept" for every layer whose forward ran and backward has not). Off (the
  // default) drops anything kept.
  void set_keep_through(bool on);
  // HF names under self_attn / input_layernorm: input_layernorm.weight,
  // q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight, then q_norm.weight,
  // k_norm.weight with qk_norm, q_proj.bias, k_proj.bias, v_proj.bias with qkv_bias,
  // o_proj.bias with out_bias, sinks with sinks.
  std::vector<Parameter> parameters() const override;
  void zero_grad() override;

  const AttentionLayerConfig& config() const { return cfg_; }
  // Tokens per sequence of the next calls (0: each call one sequence); InvalidArgument if < 0.
  void set_seq_len(std::int64_t s);
  // The context-parallel group (size cp, rank cp_rank of the config; checked). Needed
  // before any call when cp > 1; the layer does not own it.
  void set_cp_group(Communicator* group);
  // The host area for o when the config says output_on_host (needed before such a call;
  // the layer does not own it).
  void set_output_host(AttentionOutputHost* area) { out_host_ = area; }

 private:
  // The forward's internals through o and lse, allocated under `attention`.
  struct Internals {
    Buffer h, rstd, q, k, v, q_pre, k_pre, q_rstd, k_rstd, cos, sin, o, lse, ws, tile, o32, sinks32;
    Buffer qa, qa_n, qa_rstd, ckv, c_pre, c, c_rstd, kr, kv, qr;  // MLA
    // Query pieces: one piece's normed input and its queries (packed rows).
    Buffer hp, rstdp, qp, q_prep, q_rstdp;
  };
  // Query pieces (AttentionLayerBuffers::query_pieces > 1, GQA): what every phase holds (k,
  // v and their norm's state, the RoPE tables, the tile, the sinks; the piece's h and rstd),
  // allocated into `in`, the tables computed.
  template <class A>
  void pieces_common(Internals& in, std::int64_t T, const AttentionLayerBuffers& b);
  // k, v of every row, a row tile at a time through the piece's h (RoPE on k).
  template <class A>
  void project_kv(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b);
  // The piece's h and rstd (input_layernorm of its rows, packed into h_piece, rstd_piece).
  template <class A>
  void norm_piece(Internals& in, const A* x, std::int64_t b0, const AttentionPieceRows& r);
  // The piece's h, rstd and q (q_pre, q_rstd with qk_norm; RoPE at its rows' positions).
  template <class A>
  void project_q_piece(Internals& in, const A* x, std::int64_t b0, const AttentionPieceRows& r);
  // o and lse of every row (allocated here; o into the host area instead under
  // b.output_on_host), a query piece at a time.
  template <class A>
  void attend_pieces(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b);
  // The host area's o for a call of T tokens (InvalidArgument without set_output_host).
  template <class A>
  A* host_output(std::int64_t T);
  // Frees what pieces_common allocated but the linear tile.
  static void release_pieces_common(Internals& in);
  // d_o of a piece's rows (two runs under cp, packed) = dy Wo.
  template <class A>
  void piece_d_o(const AttentionPieceRows& r, std::int64_t b0, const A* dy, A* d_o, float* tile);
  // Written once for A = float | bf16 (the activation type); A = float makes the op
  // calls of the f32-only layer in its order.
  // attend false: in.o and in.lse are already there (kept); the kernel does not run.
  template <class A>
  void recompute(Internals& in, const A* x, std::int64_t T, bool attend = true);
  // h and rstd from x, allocated afresh into `in` (b: this call's buffers).
  template <class A>
  void norm_input(Internals& in, const A* x, std::int64_t T, const AttentionLayerBuffers& b);
  // q, k, v from h: GQA's (the projections, the q/k norms, RoPE) or MLA's (the
  // projections, the norms, RoPE on the rope columns).
  template <class A>
  void gqa_project(Internals& in, std::int64_t T, std::int64_t S);
  template <class A>
  void mla_project(Internals& in, std::int64_t T, std::int64_t S);
  // What an earlier forward kept (o, lse) moved into `in` when `use` and its token count is
  // T; dropped either way. Returns whether it was taken.
  bool take_kept(Internals& in, std::int64_t T, bool use);
  // Frees what a forward kept.
  void drop_kept();
  // keep: hold o and lse afterwards; reuse: take what an earlier forward kept (same T);
  // y null (forward_for_rows): o and lse only.
  template <class A>
  void forward_as(const Tensor& x, const Tensor* y, bool keep, bool reuse);
  template <class A>
  void forward_rows_as(const A* x, std::int64_t first, std::int64_t rows, A* y);
  // y rows [0, rows) += o rows [0, rows) Wo^T, output_rows at a time (the caller's rows
  // start a tile); o on the host (stage non-null, an o_tile): each tile's rows brought
  // into stage first.
  template <class A>
  void project_output(const A* o, std::int64_t rows, A* y, float* tile, A* stage = nullptr);
  // MLA's backward from dq, dk, dv (the attention's) to dh written into h's buffer; dqa, dc
  // and dkr32 are its scratch (AttentionLayerBuffers).
  template <class A>
  void mla_backward(Internals& in, std::int64_t T, std::int64_t S, A* dq, A* dk, A* dv, A* dqa, A* dc, float* dkr32,
                    float* tile);
  // The GQA projections' backward from dq, dk, dv (after RoPE's) to dh in h's buffer.
  template <class A>
  void gqa_backward(Internals& in, std::int64_t T, A* dq, A* dk, A* dv, float* tile);
  template <class A>
  void backward_as(const Tensor& x, const Tensor& dy, const Tensor& dx);
  // The backward after o_proj's (backward_output_pieces, which wrote D into row_dot) when
  // the queries go in pieces (attention_query_pieces > 1; b: the call's buffers): per piece
  // the kernel (or the ring), RoPE's, the q norm's and q_proj's backward and
  // input_layernorm's into dx; then the keys' side a row tile at a time. `in` holds k, v
  // (projected again) and lse.
  template <class A>
  void backward_pieces(Internals& in, const A* x, const A* dy, A* dx, std::int64_t T, const AttentionLayerBuffers& b,
                       Buffer& row_dot);
  // o_proj's backward with the queries in pieces ("backward output"), a piece at a time:
  // dWo += dy^T o over each run of its rows (the sum over the tokens in piece order; dbo
  // whole), D = rowsum(d_o * o) into row_dot; o (in.o, or the host area's, each piece
  // brought into an o_piece) is freed after. in.tile is the linear tile.
  template <class A>
  void backward_output_pieces(Internals& in, const A* dy, std::int64_t T, const AttentionLayerBuffers& b,
                              bool o_on_host, float* row_dot);
  void rope_tables(float* cos, float* sin, std::int64_t S);
  // One sequence (S rows at row b) through the kernel: o, lse written; bf16 via o32.
  template <class A>
  void attend_forward(Internals& in, std::int64_t b, std::int64_t S);
  // One sequence's dq, dk, dv written (before RoPE's backward) from d_o and row_dot (the
  // call's rowsum(d_o * o) [T, Hq]: o itself is not held); bf16 via dq32 / dkv32. The
  // latent ring writes dq, dc and dkr32 instead (and adds into dWkvb).
  template <class A>
  void attend_backward(Internals& in, std::int64_t b, std::int64_t S, const A* d_o, const float* row_dot, A* dq,
                       A* dk, A* dv, float* dq32, float* dkv32, A* dc, float* dkr32);
  std::int64_t check_shape(const Tensor& t, const char* what) const;
  // The group a ring call runs on: the cp group, or at cp 1 (MLA's latent form) the
  // group of one (nothing moves).
  Communicator& ring_group() const;

  Device& dev_;
  AttentionLayerConfig cfg_;
  Communicator* cp_group_ = nullptr;
  AttentionLayerTensors p_, g_;
  // forward_for_backward's o and lse and the input they belong to (null: none kept).
  Buffer kept_o_, kept_lse_;
  bool kept_on_host_ = false;  // the kept o is in out_host_'s area (output_on_host)
  Buffer kept_stage_;          // then o_proj's o_tile for forward_rows, held with lse
  AttentionOutputHost* out_host_ = nullptr;
  const void* kept_x_ = nullptr;
  std::int64_t kept_tokens_ = 0;
  bool keep_through_ = false;
};

}  // namespace peakbound
