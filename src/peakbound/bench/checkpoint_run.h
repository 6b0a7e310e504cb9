// CheckpointRun: one schedule of the checkpointed stack, set up end to end for the
// benchmark, `verify checkpoint` and the tests: its own CPU device (so Arena peaks and
// copy-engine statistics are its own), host memory, L residual MLP blocks and the
// inputs x and dy, all drawn from one seed, so two runs that differ only in schedule
// see the same numbers. A step is zero_grad, forward, backward.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/checkpoint_offload.h"
#include "peakbound/layers/residual_mlp_block.h"

namespace peakbound {

struct CheckpointRunConfig {
  std::int64_t layers = 8;
  std::int64_t tokens = 2048;
  std::int64_t hidden = 256;
  std::int64_t ffn = 0;              // 0: 8/3 hidden rounded up to a multiple of 64
  std::uint64_t seed = 1234;
  // The device's budget in bytes (> 0). Unset: auto_device_memory, enough for the
  // resident baseline.
  std::optional<std::uint64_t> device_memory;
  CheckpointOptions options;
  std::string device = "cpu";  // make_device's kind: cpu, or cuda (real PCIe copies)

  std::int64_t resolved_ffn() const;
  // Throws InvalidArgument for non-positive sizes, a device_memory of 0, bad options.
  void validate() const;
};

// Everything a run allocates on the device, from the footprint functions: the L
// blocks' parameters and gradients, the four [T, H] step tensors x, y, dy, dx
// (component layer), the stack's buffers and one block call's internals.
struct CheckpointRunBuffers {
  ResidualMlpParamBuffers block_params;  // per block
  BufferSpec io;                         // each of x, y, dy, dx
  CheckpointBuffers stack;
  ResidualMlpInternals block_internals;  // one call at a time
};
CheckpointRunBuffers checkpoint_run_buffers(const CheckpointRunConfig& c, std::uint64_t elem_bytes);

// The run's device and host bytes per phase ("forward", "backward"): the stack's
// checkpoint_footprint, L blocks' params and grads, one block call's internals and the
// four step tensors. Measured Arena peaks of a step equal it exactly.
Footprint checkpoint_run_footprint(const CheckpointRunConfig& c, std::uint64_t elem_bytes);

// The automatic device budget (auto_device_budget) of the resident baseline of this
// config: its footprint's peak total at f32, the budget both schedules are run under.
std::uint64_t auto_device_memory(const CheckpointRunConfig& c);

// What the copy engine did during one step.
struct CheckpointCopyStep {
  std::uint64_t d2h_bytes = 0, h2d_bytes = 0;
  double memcpy_seconds = 0;  // the engine's busy time copying (D2H + H2D)
  double link_wait_seconds = 0;  // emulated link: time it slept on top
  double stall_seconds = 0;      // compute waiting for copies (not hidden by overlap)
};

class CheckpointRun {
 public:
  explicit CheckpointRun(const CheckpointRunConfig& config);
  ~CheckpointRun();
  CheckpointRun(const CheckpointRun&) = delete;
  CheckpointRun& operator=(const CheckpointRun&) = delete;

  // One step; returns the seconds of forward + backward (zero_grad is not timed).
  double step();

  // Results of the last step, copied off the device.
  std::vector<float> output() const;      // y
  std::vector<float> input_grad() const;  // dx
  std::vector<float> param_grads() const; // every block's gradients, in order
  const CheckpointCopyStep& last_copy_step() const { return copy_step_; }
  // The step's inputs on the device: x, and dy (the gradient fed into backward).
  Tensor input() const;
  Tensor output_grad() const;

  const CheckpointRunConfig& config() const { return config_; }
  Device& device() { return *dev_; }
  HostMemory& host() { return *host_; }
  CheckpointedStack& stack() { return *stack_; }
  std::vector<std::unique_ptr<ResidualMlpBlock>>& blocks() { return blocks_; }

 private:
  CheckpointRunConfig config_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<HostMemory> host_;
  std::vector<std::unique_ptr<ResidualMlpBlock>> blocks_;
  Buffer x_, y_, dy_, dx_;
  std::unique_ptr<CheckpointedStack> stack_;
  CheckpointCopyStep copy_step_;
};

}  // namespace peakbound
