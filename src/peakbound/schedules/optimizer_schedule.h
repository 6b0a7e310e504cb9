// OptimizerSchedule: where the AdamW state lives and how one step moves data, behind
// one interface so the three schedules run side by side on the same inputs:
//   device          the state (fp32 master, m, v) in the device Arena; the update runs there
//   offload_serial  the state in host memory; all gradients D2H, the whole CPU update, all
//                   parameters H2D (what optimizer offload commonly does)
//   offload_stream  OffloadStreamAdamW: the same, cut into buckets and pipelined
// Each serves one shard of parameters and gradients that live on the device (the
// model owns them). A step first takes the global gradient norm over all ranks (on
// the device's gradients, before any update), then applies AdamW. All three run the
// same kernel on the same scalars, so their results are bitwise equal.
// Every buffer a schedule allocates is a spec of optimizer_buffers()
// (optimizer_footprint.h), so its footprint is exactly what it holds. Compute on
// device memory goes through ops/ (ops/adamw.h); the offload schedules' update and the
// load's bf16 conversion are host compute on host memory, through the host ops
// (ops/host_adamw.h, ops/host_convert.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/adamw_types.h"
#include "peakbound/schedules/optimizer_clip.h"
#include "peakbound/schedules/optimizer_footprint.h"
#include "peakbound/schedules/optimizer_options.h"

namespace peakbound {

// What a schedule runs on. All references must outlive the schedule. The pool is the
// host's threads: it runs the CPU device's kernels and the offload schedules' host update.
struct OptimizerContext {
  Device& device;
  HostMemory& host;
  ThreadPool& pool;
  Communicator& comm;
};

// The device-resident tensors one rank's optimizer serves: n parameters (written)
// and their gradients (read), f32 or bf16 each.
struct ParamShard {
  void* params = nullptr;
  DType param_dtype = DType::bf16;
  const void* grads = nullptr;
  DType grad_dtype = DType::bf16;
  std::int64_t n = 0;
};

// The footprint's view of a runtime shard: its element sizes, fp32 master, m and v.
OptimizerShape optimizer_shape(const ParamShard& shard);

// What one step cost. Stage times are busy times summed over buckets; the copy
// stages come from the device's copy-engine statistics.
struct OptimizerStepTimes {
  double step_seconds = 0;    // wall time of the whole step, clipping included
  double clip_seconds = 0;    // global gradient norm (device pass + cross-rank sum)
  double d2h_seconds = 0;     // gradients device -> host
  double update_seconds = 0;  // the AdamW update
  double h2d_seconds = 0;     // parameters host -> device
  std::int64_t buckets = 0;
  GradClip clip;  // the global norm; scale 1 when clipping is off
};

class OptimizerSchedule {
 public:
  // `schedule` names the buffers to allocate (optimizer_buffers).
  OptimizerSchedule(std::string_view schedule, OptimizerContext ctx, ParamShard shard, OptimizerOptions options);
  virtual ~OptimizerSchedule() = default;
  OptimizerSchedule(const OptimizerSchedule&) = delete;
  OptimizerSchedule& operator=(const OptimizerSchedule&) = delete;

  virtual std::string_view name() const = 0;

  // Sets the master weights to master[n] (host), zeroes m and v, restarts the step
  // count, and writes the device parameters from the master weights.
  void load(const float* master);

  // One AdamW step at learning rate lr (e.g. from a LrSchedule): clip(), then the update.
  OptimizerStepTimes step(float lr);
  // The global gradient norm of the current gradients and the clip scale for
  // max_grad_norm (1 when clipping is off): a device pass and a cross-rank sum, so
  // collective. Lets a caller look at the norm (non-finite?) before the update.
  GradClip clip();
  // The update with a clip computed by clip() on these gradients.
  OptimizerStepTimes step(float lr, const GradClip& clip);

  // Copies the state to host arrays of n floats each (tests, checkpoints).
  virtual void read_state(float* master, float* m, float* v) = 0;
  // A checkpoint's state: master, m, v (host arrays of n floats) and the steps taken
  // (the bias corrections continue from there); writes the device parameters from the
  // master weights, as load() does. The next step() is the one a run that was never
  // stopped would take, bit for bit.
  void restore(const float* master, const float* m, const float* v, std::int64_t steps);

  std::int64_t steps_taken() const { return steps_; }
  // Points the schedule at its gradients' new place (same count and dtype): for a caller
  // whose gradient buffer moves between steps, as PyTorch's zero_grad(set_to_none=True)
  // makes it (python/peakbound/torch.py). InvalidArgument for null with n > 0.
  void set_gradients(const void* grads);
  const ParamShard& shard() const { return shard_; }
  const OptimizerOptions& options() const { return options_; }
  // What this schedule allocates; optimizer_footprint(buffers()) is its footprint.
  const OptimizerBuffers& buffers() const { return buffers_; }

 protected:
  // Writes master, m, v of the schedule's own storage (m and v zero when null).
  virtual void load_state(const float* master, const float* m, const float* v) = 0;
  // Applies the update with the step's scalars; fills the stage times.
  virtual void apply(const AdamWStepScalars& s, OptimizerStepTimes& times) = 0;

  OptimizerContext ctx_;
  ParamShard shard_;
  OptimizerOptions options_;
  OptimizerBuffers buffers_;

 private:
  std::int64_t steps_ = 0;
};

// "device", "offload_serial", "offload_stream".
const std::vector<std::string>& optimizer_schedule_names();

// Throws InvalidArgument for an unknown name (listing the valid ones), a shard with
// a dtype other than f32/bf16, or a bucket_bytes smaller than one gradient; OutOfBudget
// when the device or host budget cannot hold the schedule's state.
std::unique_ptr<OptimizerSchedule> make_optimizer_schedule(std::string_view name, OptimizerContext ctx,
                                                           ParamShard shard, OptimizerOptions options);

}  // namespace peakbound
