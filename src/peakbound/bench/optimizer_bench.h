// The optimizer benchmark behind `peakbound bench optimizer`: every schedule on the
// same initial state and gradients, in one run, each on its own CPU device so its
// Arena measures its own peaks; the memory bandwidth measured in the same run with
// a copy kernel and an in-place read-modify-write kernel over buffers far larger
// than the last-level cache; and the ratios (stream vs serial, roofline fractions,
// pipeline efficiency) computed from those measurements. Returns one JSON object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/schedules/optimizer_schedule.h"

namespace peakbound {

// The bench's own sizes (params, warm-up and timed steps, bandwidth working set) are
// bench choices; the optimizer's knobs default to OptimizerOptions{}.
struct OptimizerBenchOptions {
  // A bound on threads: the update is memory-bound, so threads beyond the hardware's
  // only oversubscribe; 1024 is far above any host this runs on, and a finite bound
  // turns a typo (5000) into an error instead of thousands of 8 MiB thread stacks.
  static constexpr int kMaxThreads = 1024;

  std::int64_t params = 1 << 26;
  DType param_dtype = DType::bf16;
  DType grad_dtype = DType::bf16;
  std::uint64_t bucket_bytes = OptimizerOptions{}.bucket_bytes;
  int threads = default_thread_count();
  SimdLevel simd = OptimizerOptions{}.simd;
  float max_grad_norm = OptimizerOptions{}.adam.max_grad_norm;
  int warmup = 2;
  int steps = 10;
  std::vector<std::string> schedules = optimizer_schedule_names();
  std::uint64_t bandwidth_bytes = 512ull << 20;  // working set of the bandwidth kernels
  // Where each schedule's device side lives: "cpu" (the CPU device: its copies are
  // memcpy), or "cuda" (a GPU: real PCIe copies from pinned host memory).
  std::string device = "cpu";
};

// Throws InvalidArgument for options out of range (a message naming the option).
nlohmann::json run_optimizer_bench(const OptimizerBenchOptions& o);

}  // namespace peakbound
