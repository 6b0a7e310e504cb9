// The AdamW update and the sum of squares on HOST memory, run by the host CPU
// whichever device the run uses: the offloaded optimizer keeps master, m and v in
// host memory and updates them there, so this is host compute, not a device op (the
// device-memory versions are ops/adamw.h). Same math, same scalars and same order as
// the device ops' CPU kernels, so an offloaded step is bitwise equal to a device one.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/ops/adamw_types.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::ops {

// Updates t.master, t.m, t.v in place and writes t.param from t.grad, all host
// memory, over the pool in tasks of kAdamWChunk elements, with the `simd` body.
// t.param may be t.master itself (f32): then it is not written a second time. A
// large update writes t.param with streaming stores (kernels/cpu/adamw.h,
// kAdamWStreamBytes); the bits are the same.
// Returns when done. Throws InvalidArgument for a dtype other than f32/bf16,
// Unavailable if this CPU lacks `simd`.
void host_adamw_update(ThreadPool& pool, SimdLevel simd, const AdamWStepScalars& s, const AdamWTensors& t);

// Sum of x[i]^2 in double over n elements of host memory x (f32 or bf16), in the
// fixed order of the device op (bitwise the same for every level and thread count).
double host_sum_squares(ThreadPool& pool, SimdLevel simd, const void* x, DType dtype, std::int64_t n);

}  // namespace peakbound::ops
