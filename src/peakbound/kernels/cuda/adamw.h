// The CUDA backend's AdamW update and sum of squares on device memory, llm.c style,
// launched on `stream` (a cudaStream_t). The per-element math is the CPU reference's
// (ops/adamw_types.h) with the same fmaf/sqrtf/division (IEEE-rounded under nvcc's
// defaults) and the same round-to-nearest-even bf16 conversion, so the update is
// bitwise the CPU scalar body's. The sum of squares is summed in double in a GPU order:
// equal to the CPU's to double rounding, not bitwise.
//   adamw_update   master, m, v [n] f32 updated IN PLACE; grad [n] (f32/bf16) read;
//                  param [n] (f32/bf16) WRITTEN
//   sum_squares    result[0] = sum x[i]^2 (double) once the stream reaches it; result is
//                  memory the device writes and the host reads (mapped pinned host memory) of
//                  at least 257 doubles (the blocks' partial sums follow the result)
#pragma once

#include <cstdint>

#include "peakbound/kernels/adamw_types.h"

namespace peakbound::cuda {

void adamw_update(void* stream, const AdamWStepScalars& s, const AdamWTensors& t);
void sum_squares(void* stream, const void* x, DType dtype, std::int64_t n, double* result);

}  // namespace peakbound::cuda
