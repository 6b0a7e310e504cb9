// PlanInputs: everything `peakbound plan` needs to predict per-device memory: the
// model, the run (context, batch, dtypes), the layout over devices, which of the
// four schedules are on, and their knobs. Each knob's default is read from its
// schedule's options struct (the one place a default lives), and the planner sizes
// each schedule with that schedule's own footprint function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "peakbound/core/precision.h"
#include "peakbound/model/model_config.h"
#include "peakbound/schedules/checkpoint_policy.h"
#include "peakbound/schedules/moe_plan.h"
#include "peakbound/schedules/optimizer_options.h"
#include "peakbound/schedules/schedule_set.h"
#include "peakbound/schedules/vocab_loss.h"

namespace peakbound {

// Ranges the planner accepts: generous for any real run, small enough that no product
// of them overflows before the checked byte arithmetic reports it.
inline constexpr std::int64_t kMaxDevices = std::int64_t{1} << 24;    // 16M devices
inline constexpr std::int64_t kMaxSequences = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxContext = std::int64_t{1} << 40;    // 1T tokens
inline constexpr std::int64_t kMaxRows = std::int64_t{1} << 40;       // knobs counted in tokens or copies

struct PlanInputs {
  ModelConfig model;

  // Run.
  std::int64_t context = 0;           // tokens per sequence
  std::int64_t sequences = 1;         // sequences per step per data-parallel group
  // The element sizes. `plan --precision bf16|f32` sets parameters and activations to 2
  // or 4 bytes with gradients and state at 4: what `train --precision` runs (other sizes
  // are the analytic estimate's).
  std::int64_t param_bytes = 2;       // bf16 parameters and activations
  std::int64_t activation_bytes = 2;
  std::int64_t grad_bytes = 4;        // fp32 gradient shards (accumulation in fp32)
  std::int64_t optimizer_state_bytes = 4;  // each of the master weight, Adam m and v (fp32)

  // Layout.
  std::int64_t devices = 1;
  std::int64_t ep = 1;          // expert-parallel size; 0 = auto (see resolve_auto)
  std::int64_t cp = 1;          // context-parallel size (sequence split)
  std::int64_t vocab_group = 1; // ranks sharing one vocabulary-sharded LM head; 0 = auto
  std::int64_t fsdp = 0;        // FSDP shard group of the non-expert parameters; 0 = all devices
  std::uint64_t device_memory = 0;
  // Host memory of one node, shared by its devices (a common 8-GPU node: 2 TiB); 0 = unlimited.
  std::uint64_t host_memory = std::uint64_t{2} << 40;
  std::int64_t devices_per_node = 8;

  // Schedules and their knobs.
  ScheduleSet schedules;
  std::int64_t dispatch_cap = DispatchOptions{}.cap;        // PipelinedLLEP: copies per source rank per round
  double llep_alpha = DispatchOptions{}.alpha;             // LLEP capacity factor over the mean load
  double llep_lambda = DispatchOptions{}.lambda;           // LLEP: imbalance below which nothing spills
  std::int64_t llep_min_spill = DispatchOptions{}.min_spill;  // LLEP: smallest spilled piece, token-copies
  std::int64_t vocab_chunk = VocabLossOptions{}.chunk;               // Ring-DTP: token rows per logits block
  // SCO: boundaries prefetched ahead in backward (the ring holds depth + 1); -1 the
  // policy's choice (estimate_with_policy): CheckpointOptions' default while the plan fits
  // the device with it, else 0 (one slot, the blocks forward in place in it).
  std::int64_t prefetch_depth = -1;
  // The depth a plan is made at when no policy chooses: prefetch_depth, or the default.
  std::int64_t planned_prefetch_depth() const {
    return prefetch_depth < 0 ? CheckpointOptions{}.prefetch_depth : prefetch_depth;
  }
  // Checkpoint groups under SCO (CheckpointOptions::group_layers): one boundary per group of
  // this many layers, the group's other inputs recomputed in its backward. -1 the policy's
  // choice (estimate_with_policy): 1, or where the host memory does not hold the plan the
  // fewest layers a group with which it fits. The baseline keeps a boundary per layer.
  std::int64_t checkpoint_group = -1;
  // The scheduled plan's embedding (train's --embedding): "fsdp", "vocab" (sharded over the
  // vocabulary group), or "auto" (train's default): vocab where the trainer's footprint fits
  // the device with it at the plan's context, else fsdp, the smaller peak where neither fits
  // (make_plan; its reach takes the better at each context; the estimate's rules, without
  // the trainer's footprint, take fsdp). The baseline's is fsdp.
  std::string embedding = "auto";
  // The scheduled plan's attention under cp > 1 (train's --context-attention): "ring",
  // "ulysses" (the heads split over the cp group; ModelConfig::ulysses_attention), or
  // "auto": Ulysses where the trainer's footprint with it has the smaller peak at the plan's
  // context (make_plan), the ring otherwise and wherever Ulysses cannot split the heads. The
  // baseline's is the ring.
  std::string context_attention = "auto";
  // The group size a plan is made at when no policy chooses: checkpoint_group, or 1.
  std::int64_t planned_checkpoint_group() const { return checkpoint_group < 1 ? 1 : checkpoint_group; }
  // SCO: keep the last K boundaries resident on the device. Unset: the selective policy
  // (offload all but the ring, or keep as few as make the host memory fit).
  std::optional<std::int64_t> resident_layers;
  std::uint64_t adam_bucket = OptimizerOptions{}.bucket_bytes;  // OffloadStreamAdamW bucket, bytes

  // Routing skew: received token-copies at the most loaded rank over the balanced
  // share (1 = balanced; 0 = the worst case the layout allows).
  double skew = 1.0;
  // train --keep-attention (ModelSchedules::keep_attention): every layer's attention output
  // and log-sum-exp held from its forward to its backward.
  bool keep_attention = false;
  // The CPU attention kernel's shares a rank runs (ModelSchedules::attention_threads), each
  // a workspace slot: a `train` on the CPU device takes the rank's cores (train/run.h,
  // cpu_attention_threads; `plan --trainer-defaults` too), 1 elsewhere.
  int attention_threads = 1;
  // train's default (--keep-attention not given): the policy sets keep_attention, true
  // while the plan fits device_memory with it at one boundary per layer, else false
  // (PeakEstimate::keep_attention says which).
  bool keep_attention_by_budget = false;
  // train --keep-logits (VocabLossOptions::keep_logits): Ring-DTP's logits blocks held from
  // the loss's forward to its backward (a vocabulary group of several devices).
  bool keep_logits = false;
  // train's default (--keep-logits not given): the policy sets keep_logits, true while the
  // plan fits device_memory with them (dropped before the attention), else false
  // (PeakEstimate::keep_logits says which).
  bool keep_logits_by_budget = false;
  // train --keep-experts (ModelSchedules::keep_experts): every MoE layer's routed experts'
  // forward (gate, up, act, out of each row a device computes) held for its backward.
  bool keep_experts = false;
  // train's default (--keep-experts not given): the policy sets keep_experts, true while
  // the plan fits device_memory with them (dropped first), else false
  // (PeakEstimate::keep_experts says which).
  bool keep_experts_by_budget = false;
  // What train's default --device-memory auto decides (plan --trainer-defaults without
  // --device-memory): it names no memory to spend on speed, so the experts and the logits
  // kept by the budget are kept only where they leave the plan's peak where it is.
  bool device_memory_auto = false;

  // The analytic estimate even for a run the trainer executes (tests of the estimate's
  // own rules, which a trainable bf16 or f32 run would otherwise bypass).
  bool analytic = false;

  // Fixed reserves (CUDA context and NCCL buffers; GEMM workspace and allocator slack).
  std::uint64_t comm_reserve = 1ull << 30;
  std::uint64_t workspace_reserve = 512ull << 20;

  // Replaces 0 ("auto") by the usual layout: ep = the largest divisor of both the
  // device and expert counts up to 64 (1 for a dense model); vocab_group = the
  // largest divisor of the device count up to 8 (one node's tensor-parallel group).
  void resolve_auto();
  // Throws InvalidArgument naming the first inconsistency (EP not dividing the experts...).
  void validate() const;
  std::int64_t fsdp_size() const { return fsdp > 0 ? fsdp : devices; }
  // The runtime precision whose activations are activation_bytes wide (2: bf16, 4: f32),
  // whose footprint forms count what that runtime allocates (its fp32 temporaries under
  // bf16); none for another size, which only the elem_bytes estimates model.
  std::optional<Precision> activation_precision() const {
    if (activation_bytes == 2) return Precision::bf16;
    if (activation_bytes == 4) return Precision::f32;
    return std::nullopt;
  }
  DispatchOptions dispatch_options() const;
  // This device's share of its node's host memory; MemoryLedger::kUnlimited when unlimited.
  std::uint64_t host_budget() const;
};

}  // namespace peakbound
