// VocabLoss: the LM head's projection and cross-entropy over a vocabulary group of
// P ranks. Each rank brings its own tokens (hidden [T, H], targets [T]; T may differ
// between ranks) and holds one vocabulary shard of the head weight W [rows, H]
// (vocab_shard() says which). forward returns this rank's summed loss and valid-token
// count; backward gives dHidden for its tokens and adds into dW for its shard;
// forward_backward does both for a caller that knows the gradient's scale up front.
// Two implementations behind this interface, measured side by side:
//   materialized  Megatron-style vocab-parallel cross-entropy (the baseline)
//   ring_dtp      Ring-DTP: the smaller of activations and weight shards circulates,
//                 logits exist only as [chunk, V/P] blocks folded into an online LSE
// All scratch memory comes from the device Arena under Component::vocab, allocated
// from the BufferSpecs of vocab_footprint.h (the same functions the planner calls).
//
// Precision (VocabLossOptions::precision, docs/precision.md): under bf16 the hidden
// states, d_hidden, the head weight W and Ring-DTP's carried lanes (the W shard in
// weights mode, the token rows in activations mode) are bf16; the logits (fp32 sums of
// exact bf16 products, ops::gemm_bf16), the log-sum-exp and row statistics, the loss,
// dW and every dX/dW accumulator stay fp32. Backward narrows each logit-gradient tile G
// to bf16 once, then dW += G16^T H (fp32, added into) and dH = G16 W (fp32 sums; where
// several shards or ranks add into one d_hidden row, in an fp32 d_hidden32 narrowed
// once at the end). The f32 instantiation makes exactly the f32 code's calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"

namespace peakbound {

// Rank r's rows of a V-row vocabulary split over P ranks (the first V % P get one more).
struct VocabShard {
  std::int64_t offset = 0;
  std::int64_t rows = 0;
};
VocabShard vocab_shard(std::int64_t vocab, int ranks, int rank);

enum class RingMode : std::uint8_t { automatic, activations, weights };
std::string_view ring_mode_name(RingMode m);
// auto | activations | weights; InvalidArgument naming the option otherwise.
RingMode parse_ring_mode(std::string_view s);

// The head's dimensions: global vocabulary V and hidden size H.
struct VocabDims {
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
};

// Every knob of the vocabulary loss, with its one default (the CLI flags and the
// planner read these defaults; a change of default is one line here).
struct VocabLossOptions {
  std::int64_t chunk = 256;          // Ring-DTP: token rows per [chunk, V/P] logits block
  float z_loss = 0.0f;               // coefficient of z * lse^2; finite, >= 0
  std::int32_t ignore_index = -100;  // targets equal to it contribute nothing
  RingMode mode = RingMode::automatic;  // Ring-DTP: what circulates
  Precision precision = Precision::f32;  // bf16: hidden, d_hidden, W and the carried lanes bf16
  // Ring-DTP at P > 1: the forward keeps every logits block it computes ([the group's
  // tokens, V/P] in activations mode, [T, V] in weights mode, fp32) for the backward, which
  // then turns each into its gradient in place instead of computing it again: 3 GEMMs a
  // block instead of 4, the same bits, for that much more memory from the forward to the
  // backward (the materialized baseline's logits term, split over the group). The trainer
  // keeps them while its plan fits the device budget (train --keep-logits).
  bool keep_logits = false;
};

// InvalidArgument naming the option ("vocab loss chunk must be positive") when a knob
// is out of range; make_*_vocab_loss and the footprint functions call it.
void validate(const VocabLossOptions& o);
void validate(const VocabDims& d);

struct LossSum {
  double loss = 0;         // summed over this rank's valid tokens
  std::int64_t count = 0;  // this rank's valid tokens
};

// Where an implementation's time went since the last reset_stats(): its GEMMs' FLOPs
// (2 m n k each, counted from the shapes) and the steady-clock seconds spent inside
// ops::gemm, and the seconds spent in communication calls (the baseline's collectives,
// Ring-DTP's ring begin/progress/wait/end/finish: waiting for data and for the slowest
// rank). The clock brackets each call; on the CPU device the compute stream runs inline,
// so the seconds are the calls' own (about 50 ns of clock reads per call).
struct VocabLossStats {
  double gemm_flops = 0;
  double gemm_seconds = 0;
  std::int64_t gemm_calls = 0;
  double comm_seconds = 0;
};

class VocabLoss {
 public:
  virtual ~VocabLoss() = default;
  virtual std::string name() const = 0;
  // The device whose memory every pointer argument is in.
  virtual Device& device() const = 0;
  // The precision it was made with (VocabLossOptions::precision): the float* entry
  // points need f32, the bf16* ones bf16 (InvalidArgument otherwise).
  Precision precision() const { return precision_; }
  // hidden [T, H], targets [T], weight [vocab_shard(...).rows, H]; they must stay
  // valid until backward. Collective over the group. Reads only; returns the fp32 loss.
  LossSum forward(const float* hidden, const std::int32_t* targets, std::int64_t tokens, const float* weight);
  LossSum forward(const bf16* hidden, const std::int32_t* targets, std::int64_t tokens, const bf16* weight);
  // Gradient of scale x (summed loss): writes d_hidden [T, H] (f32 | bf16), adds into
  // d_weight (fp32 in both precisions).
  void backward(float scale, float* d_hidden, float* d_weight);
  void backward(float scale, bf16* d_hidden, float* d_weight);
  // forward then backward in one call, for a caller that knows the scale up front:
  // reads hidden, targets, weight; writes d_hidden [T, H]; adds into d_weight; keeps
  // nothing afterwards. The default is exactly forward + backward; Ring-DTP overrides
  // it at P = 1 with the fused form (each [chunk, V] logits block becomes its gradient
  // at once: 3 GEMMs a block instead of 4, no saved state, a peak of one block).
  LossSum forward_backward(const float* hidden, const std::int32_t* targets, std::int64_t tokens, const float* weight,
                           float scale, float* d_hidden, float* d_weight);
  LossSum forward_backward(const bf16* hidden, const std::int32_t* targets, std::int64_t tokens, const bf16* weight,
                           float scale, bf16* d_hidden, float* d_weight);
  // Frees what the last forward keeps for its backward (an evaluation forward has no
  // backward: without this its buffers would stay held through whatever runs next).
  virtual void discard() = 0;
  // The tokens the next calls' buffers are sized for on this rank where more than a call
  // passes (0: each call's own). A caller that passes only the tokens with a target (the
  // model under Ring-DTP) reserves the step's, so the loss's memory, like its plan, does
  // not depend on which targets are ignored; the work and the ring's messages are the
  // passed tokens'. Ring-DTP takes it; the materialized loss sizes by the call.
  void reserve_tokens(std::int64_t tokens) { reserved_ = tokens; }
  // The mode Ring-DTP chose for the last step ("activations"/"weights", "fused" for a
  // fused forward_backward); "" otherwise.
  virtual std::string mode_used() const { return ""; }
  // GEMM and communication time since the last reset_stats() (both implementations
  // count every GEMM and every communication call).
  const VocabLossStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  explicit VocabLoss(Precision p) : precision_(p) {}
  // The entry points above, their pointers' element type checked against precision():
  // hidden, weight and d_hidden are float* under f32 and bf16* under bf16.
  virtual LossSum forward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                              const void* weight) = 0;
  virtual void backward_any(float scale, void* d_hidden, float* d_weight) = 0;
  // Default: forward_any then backward_any.
  virtual LossSum forward_backward_any(const void* hidden, const std::int32_t* targets, std::int64_t tokens,
                                       const void* weight, float scale, void* d_hidden, float* d_weight);
  // ops::gemm (same arguments; A = float | bf16 operands, fp32 C: bf16 accumulates in
  // fp32), counted and timed into stats(). A float a with a bf16 b is ops::gemm_bf16_wide_a
  // (a holds bf16 values in fp32; only where ops::gemm_bf16_takes_wide_a).
  template <class A, class B = A>
  void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
            float alpha, const A* a, std::int64_t lda, const B* b, std::int64_t ldb, float beta, float* c,
            std::int64_t ldc);
  // Runs f (a communication call), its seconds counted in stats().comm_seconds.
  template <typename F>
  decltype(auto) comm(F&& f) {
    struct Clock {
      double& into;
      std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
      ~Clock() { into += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } clock{stats_.comm_seconds};
    return f();
  }

 private:
  void expect(Precision p) const;
  VocabLossStats stats_;

 protected:
  std::int64_t reserved_ = 0;

 private:
  Precision precision_;
};

std::unique_ptr<VocabLoss> make_materialized_vocab_loss(Device& dev, Communicator& group, const VocabDims& d,
                                                        const VocabLossOptions& o);
std::unique_ptr<VocabLoss> make_ring_dtp_vocab_loss(Device& dev, Communicator& group, const VocabDims& d,
                                                    const VocabLossOptions& o);

// Shared by both: every rank's token count (collective), and a check that every target
// is in [0, V) or ignore_index, agreed on by all ranks so none is left waiting (the
// targets, device memory, are read back with one copy).
std::vector<std::int64_t> gather_token_counts(Communicator& group, std::int64_t tokens);
void check_targets(Device& dev, Communicator& group, const std::int32_t* targets, std::int64_t tokens,
                   std::int64_t vocab, const VocabLossOptions& o);

}  // namespace peakbound
