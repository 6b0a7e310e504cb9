// AdamW on device memory, through the device's backend: the update of master, m, v
// and the parameters from the gradients, and the gradients' sum of squares for the
// global norm. The `device` optimizer schedule runs these; a CUDA build adds its
// kernels behind the same calls. The scalars and tensor descriptions are
// backend-neutral (ops/adamw_types.h).
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"
#include "peakbound/ops/adamw_types.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::ops {

// How the CPU backend runs these kernels: over which pool, with which SIMD body. A
// backend with its own execution model ignores them.
struct AdamWLaunch {
  ThreadPool* pool = nullptr;
  SimdLevel simd = SimdLevel::scalar;
};

// Updates t.master, t.m, t.v in place and writes t.param from t.grad (all device
// memory), in s's order.
void adamw_update(Device& dev, Stream& s, const AdamWStepScalars& sc, const AdamWTensors& t,
                  const AdamWLaunch& l);

// Sum of x[i]^2 in double over n elements of device memory x (f32 or bf16), in a fixed
// order (bitwise the same for every thread count); waits for s and returns it.
double sum_squares(Device& dev, Stream& s, const void* x, DType dtype, std::int64_t n, const AdamWLaunch& l);

}  // namespace peakbound::ops
