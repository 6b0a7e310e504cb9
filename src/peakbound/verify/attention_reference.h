// The exactness harness of ring attention (schedules/ring_attention.h), shared by the
// tests, `verify attention` and `bench attention`: a deterministic single-sequence
// problem that every rank generates whole (so the references need no communication),
// the naive double-precision reference and the single-rank kernel on the whole
// sequence, and one forward + backward of ring attention over a CP group compared with
// both, row by row at the zigzag positions.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/component.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/attention.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound {

class ThreadPool;

// dims.tokens is the sequence length S (offsets, kv_tokens and accumulate unset).
// q, k in [-2, 2], v, dout in [-1, 1], uniform, from mt19937(seed).
struct AttentionProblem {
  AttentionDims dims;
  std::vector<float> q, k, v, dout;  // [S, Hq, D], [S, Hkv, D], [S, Hkv, Dv], [S, Hq, Dv]
};
AttentionProblem make_attention_problem(const AttentionDims& dims, std::uint64_t seed);

// out [S, Hq, Dv], lse [S, Hq], dq, dk, dv of loss = sum(dout * out).
struct AttentionResult {
  std::vector<float> out, lse, dq, dk, dv;
};
// The textbook attention in double (full score rows, two-pass softmax), rounded once.
AttentionResult naive_attention(const AttentionProblem& p);
// The CPU kernel (ops::host_attention_forward / _backward) on the whole sequence (host vectors).
AttentionResult kernel_attention(const AttentionProblem& p, ThreadPool* pool = nullptr);

// Relative errors (max|a - ref| / max|ref| over the group's whole tensor, rows at the
// zigzag positions) of out, lse, dq, dk, dv, against each reference; and the arena's
// peak of component attention during the forward and during the backward call (the
// caller's tensors are allocated under `io`, so with io != attention these are the
// ring's own buffers).
struct RingAttentionCheck {
  double naive[5] = {0, 0, 0, 0, 0};
  double kernel[5] = {0, 0, 0, 0, 0};
  std::uint64_t forward_peak = 0, backward_peak = 0;
  double worst_naive() const;
  double worst_kernel() const;
};
inline constexpr const char* kAttentionFields[5] = {"out", "lse", "dq", "dk", "dv"};

// Collective over cp_group. Runs ring attention (kind ulysses: Ulysses attention,
// schedules/ulysses_attention.h, the same calls) with seq_len = p.dims.tokens, carrying
// pieces of piece_tokens (RingAttentionConfig::piece_tokens; 0: whole shards); with
// query_pieces > 1 the queries go in that many calls (RingAttentionConfig::query_pieces:
// each piece's rows packed, dk and dv summed over the calls) and the peaks are the
// largest call's.
RingAttentionCheck verify_ring_attention(Device& dev, Communicator& cp_group, const AttentionProblem& p,
                                         const AttentionResult& naive, const AttentionResult& kernel,
                                         Component io = Component::layer, ThreadPool* pool = nullptr,
                                         std::int64_t piece_tokens = 0, int query_pieces = 1,
                                         ContextAttention kind = ContextAttention::ring);

}  // namespace peakbound
