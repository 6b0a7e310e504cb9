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

struct OptimizerBenchOptions {
  std::int64_t params = 1 << 26;
  DType param_dtype = DType::bf16;
  DType grad_dtype = DType::bf16;
  std::uint64_t bucket_bytes = 1ull << 20;
  int threads = cpu::default_thread_count();
  cpu::SimdLevel simd = cpu::best_simd_level();
  float max_grad_norm = 1.0f;
  int warmup = 2;
  int steps = 10;
  std::vector<std::string> schedules = optimizer_schedule_names();
  std::uint64_t bandwidth_bytes = 512ull << 20;  // working set of the bandwidth kernels
};

// Throws InvalidArgument for options out of range (a message naming the flag).
nlohmann::json run_optimizer_bench(const OptimizerBenchOptions& o);

}  // namespace peakbound
