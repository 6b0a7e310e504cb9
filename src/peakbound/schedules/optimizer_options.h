// OptimizerOptions: every knob of the optimizer schedules and its one default. The
// library, `peakbound bench optimizer` (its flag defaults read from here) and the
// planner all read this struct, so a change of default is one line here.
#pragma once

#include <cstdint>

#include "peakbound/ops/adamw_types.h"

namespace peakbound {

struct OptimizerOptions {
  // AdamW hyper-parameters (lr, betas, eps, weight decay, max_grad_norm; <= 0 turns
  // global-norm clipping off).
  AdamWConfig adam;
  // offload_stream: gradient bytes per bucket (a bucket is bucket_bytes / sizeof(grad)
  // parameters, at most the shard). 1 MiB measured best on the CPU device, where
  // staging that stays in cache saves memory traffic; across PCIe larger buckets
  // amortise each copy's start, so a CUDA build may measure a larger one.
  std::uint64_t bucket_bytes = 1ull << 20;
  // The CPU update's SIMD body (the CPU backend's knob; the widest this CPU runs).
  SimdLevel simd = best_simd_level();
};

}  // namespace peakbound
