// Trainer: one optimizer step of a MoeTransformer over this rank's micro-batches.
//
//   zero gradients
//   for each micro-batch: forward + backward (the cross-entropy's gradient scaled by
//       1 / the valid targets of the whole step over the world, the aux loss's by
//       1 / micro-batches), gradients accumulating in the FSDP shard (reduced layer by
//       layer during the backward) and in the two stores held whole (experts, head)
//   reduce-scatter each store's gradients over its replica group: rank r of a group of
//       G gets the summed slice r of the store (the stores are padded to a multiple of G),
//       into the FSDP shard buffer's tail, after the units' shard
//   one AdamW step over this rank's slices (the FSDP shard and the two stores' slices
//       side by side in the FSDP shard buffers, updated in place), with the global
//       gradient norm over the world (the slices are disjoint and cover every parameter
//       once, so the norm is the model's)
//   all-gather the stores' updated slices (the FSDP shard is already the model's)
// The optimizer state therefore lives sharded over the data-parallel ranks (fp32 master,
// m and v of 1/G of every parameter per rank) on the device or offloaded
// (OffloadStreamAdamW, the `adam` schedule).
// Under bf16 (ModelSchedules::precision) the optimizer's shard holds bf16 parameters (AdamW
// narrows its fp32 master into them, round to nearest even) and f32 gradients; the
// compute copy the model holds (FSDP shard, store slices all-gathered in bf16) is always
// to_bf16(master). The reduce-scatter of the stores' gradients stays f32, and so do the
// master, m and v a checkpoint holds.
// Loss = (sum of cross-entropy over the world's valid targets) / their count
//        + the mean over micro-batches of the aux loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peakbound/core/phase_clock.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/train/moe_transformer.h"

namespace peakbound {

// `sequences` sequences of `seq_len` tokens each (host arrays of sequences x seq_len);
// under context parallelism the same on every rank of a cp group (each computes its shard).
struct MicroBatch {
  const std::int32_t* ids = nullptr;
  const std::int32_t* targets = nullptr;
  std::int64_t sequences = 0;
  std::int64_t seq_len = 0;
};

// A piece of one tensor in this rank's optimizer shard: elements [begin, begin + count)
// of the tensor `name` (flattened, row-major, its full shape `shape`) at shard_offset.
struct ShardSegment {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, count = 0;
  std::uint64_t shard_offset = 0;
};

struct TrainerOptions {
  std::string optimizer = "device";  // an optimizer_schedule_names() entry
  OptimizerOptions optimizer_options;
  LrSchedule lr;
  // A non-finite loss or gradient norm: false stops (step() throws NonFinite naming the
  // step and the first non-finite gradient and, under bf16, the first non-finite bf16
  // parameter (a master beyond bf16's range rounds to inf), before any parameter changes); true skips
  // the update (the step is counted, StepStats::skipped set, the optimizer state untouched).
  bool skip_nonfinite = false;
  // DeepSeek-V3's auxiliary-loss-free balancing: after each update, each MoE layer's
  // correction bias moves by this much against its experts' load error
  // (MoeTransformer::update_router_bias; the report's 0.001). 0 freezes the biases. Only
  // a model with router_score_correction has them.
  float router_bias_speed = 0.001f;
};

struct StepStats {
  std::int64_t step = 0;
  double loss = 0;          // ce + aux
  double ce = 0;            // mean cross-entropy over the world's valid targets
  double aux = 0;           // coef x load-balancing loss, mean over micro-batches
  std::int64_t tokens = 0;  // valid targets over the world
  std::int64_t inputs = 0;  // input tokens over the world
  double grad_norm = 0;     // before clipping
  float lr = 0;
  double seconds = 0;       // wall time of the step
  // Its split by phase on this rank (core/phase_clock.h): each phase's time on the step's
  // thread; `other` is the rest of `seconds`, so they sum to it (a completed step only).
  PhaseSeconds phases{};
  // Its exposed communication on this rank: the step's thread's time in communication
  // calls and waits (core/phase_clock.h's CommunicationScope), across the phases.
  double communication_seconds = 0;
  bool skipped = false;     // non-finite loss or gradient norm: no update (skip_nonfinite)
  std::string nonfinite;    // what was non-finite, when skipped
  // A stop the ranks agreed on between micro-batches (the largest value any rank's
  // StopCheck returned): the step was abandoned after `micro_batches_done` of its
  // micro-batches, with no update and not counted (steps_taken() is unchanged); only
  // step, stopped, micro_batches_done and seconds are set.
  std::int64_t stopped = 0;
  std::int64_t micro_batches_done = 0;
};

// Asked between micro-batches whether to stop: 0 to go on, anything else (a signal
// number, say) to abandon the step. Must be cheap; called on every rank.
using StopCheck = std::function<std::int64_t()>;

class Trainer {
 public:
  // Allocates the optimizer state over the model's FSDP shard buffers (the units' shard,
  // then this rank's slices of the stores in their tail, FsdpUnits::tail_elements():
  // AdamW updates the FSDP shard in place, no copy to or from a shard of its own) and loads the model's current
  // parameters as the master weights: under f32 read back from the device, under bf16 the
  // pending masters init_parameters / load_hf left (taken; InvalidArgument, one line, when
  // there are none; a second Trainer on the model finds none), after which the model
  // computes with to_bf16 of them. Collective over the world.
  Trainer(MoeTransformer& model, HostMemory& host, ThreadPool& pool, const TrainerOptions& options);
  ~Trainer();

  // One step over this rank's micro-batches (every rank the same number). Collective.
  // Throws NonFinite (on every rank, the same message) on a non-finite loss or gradient
  // norm unless options.skip_nonfinite. With `stop`, after each micro-batch but the last
  // the ranks all-reduce (max) what it returns, one int64: nonzero abandons the step on
  // every rank together (StepStats::stopped), the model and optimizer as before it.
  StepStats step(std::span<const MicroBatch> micro, const StopCheck& stop = {});
  std::int64_t steps_skipped() const { return skipped_; }
  // Mean cross-entropy (no aux) of the given batches over the world. Collective.
  double evaluate(std::span<const MicroBatch> batches, std::int64_t* tokens = nullptr);

  std::int64_t steps_taken() const { return step_; }
  const OptimizerSchedule& optimizer() const { return *opt_; }
  MoeTransformer& model() const { return model_; }

  // Where this rank's optimizer shard comes from (checkpoints): one segment per tensor
  // piece, in shard order, padding left out.
  std::vector<ShardSegment> shard_segments() const;
  std::uint64_t shard_elements() const { return shard_elems_; }
  // This rank's optimizer state: master weights, m, v (host arrays of shard_elements()).
  void read_shard(float* master, float* m, float* v) const;
  // Restores a checkpoint's state into this rank's shard (elements the segments do not
  // cover must be 0), the optimizer's update count and the trainer's step count (they
  // differ by the steps skipped), then writes the parameters everywhere (the FSDP shard;
  // each store's slices all-gathered): the model and optimizer a run that was never
  // stopped holds after `step` steps. Collective over the world.
  void restore(const float* master, const float* m, const float* v, std::int64_t optimizer_steps,
               std::int64_t step);

 private:
  struct Slice {
    ParameterStore* store;
    Communicator* group;
    std::uint64_t len;     // elements per rank
    std::uint64_t offset;  // in the shard buffers
    // The store lives in the shard buffers at offset (a one-rank group: MoeTransformer's
    // StoreMemory): nothing to reduce-scatter into the shard or gather back from it.
    bool in_shard = false;
  };
  MoeTransformer& model_;
  TrainerOptions options_;
  std::vector<Slice> slices_;
  std::uint64_t shard_elems_ = 0;
  std::uint64_t fsdp_len_ = 0;  // the FSDP units' shard, first in the shard buffers
  void* param_shard_ = nullptr;   // the FSDP shard buffers (params_shard_raw, grads_shard): units, then
  float* grad_shard_ = nullptr;   // the stores' slices

  std::string first_nonfinite_gradient() const;
  // The master's bf16 (or f32) copy in the shard buffer written where the model computes
  // with it: the FSDP shard (a device copy) and each store's slices (all-gathered over its
  // group in the param dtype). Collective over the world.
  void publish();
  // Under bf16: the first master from the model's pending masters, at the shard's offsets.
  std::vector<float> take_pending_masters();

  std::unique_ptr<OptimizerSchedule> opt_;
  std::int64_t step_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace peakbound
