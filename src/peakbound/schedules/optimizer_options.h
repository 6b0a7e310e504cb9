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
  // parameters, at most the shard). 8 MiB: on the CPU device (2 cores, 64M bf16
  // parameters) 1 MiB buckets made the streamed step 0.86-0.93x the serial one, because
  // each bucket is a synchronisation between the update threads and the copy threads
  // that share the cores; 8-16 MiB buckets ran it at 1.05-1.17x (docs/offload_stream_adamw.md).
  // Across PCIe larger buckets also amortise each copy's start. Host staging is 4 buckets.
  std::uint64_t bucket_bytes = 8ull << 20;
  // The offload schedules on a device whose memory is the host's own (the CPU device):
  // true updates the device shard where it lies, with no host staging and no copies
  // (the same kernel on the same elements: the same bits). A device the host cannot
  // address (CUDA, or the CPU device under PEAKBOUND_STRICT_DEVICE=1, which plays a GPU
  // to host code) refuses it. False stages through host memory as across PCIe:
  // `peakbound bench optimizer` times that schedule; `peakbound train` on the CPU device
  // sets true (there each step's staging was ~8% of the main job's step).
  bool in_place = false;
  // The CPU update's SIMD body (the CPU backend's knob; the widest this CPU runs).
  SimdLevel simd = best_simd_level();
};

}  // namespace peakbound
