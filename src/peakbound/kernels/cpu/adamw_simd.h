// The SIMD bodies of the AdamW kernels (internal to kernels/cpu). Each lives in its
// own file, compiled with a function-level target attribute, so the rest of the
// build needs no -m flags; adamw.cc calls one only after checking the CPU has it.
// Tails shorter than a vector go to the scalar reference body, which computes the
// same bits.
#pragma once

#include "peakbound/kernels/cpu/adamw.h"

namespace peakbound::cpu::simd {

void adamw_scalar(const AdamWStepScalars& s, const AdamWTensors& t);
void adamw_avx2(const AdamWStepScalars& s, const AdamWTensors& t);
void adamw_avx512(const AdamWStepScalars& s, const AdamWTensors& t);

// Adds x[j]^2 (fused) into lanes[j % kSquaresLanes] for j in [0, n).
void squares_scalar(const void* x, DType dtype, std::int64_t n, double* lanes);
void squares_avx2(const void* x, DType dtype, std::int64_t n, double* lanes);
void squares_avx512(const void* x, DType dtype, std::int64_t n, double* lanes);

}  // namespace peakbound::cpu::simd
