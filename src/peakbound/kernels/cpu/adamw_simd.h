// The SIMD bodies of the AdamW kernels (internal to kernels/cpu). Each lives in its
// own file, compiled with a function-level target attribute, so the rest of the
// build needs no -m flags; adamw.cc calls one only after checking the CPU has it.
// Tails shorter than a vector go to the scalar reference body, which computes the
// same bits. With `stream`, the vector bodies write the parameter (a write-only
// output) with non-temporal stores from its first 64-byte boundary on (the elements
// before it go to the scalar body) and end with an sfence; the bits are the same.
// Where the parameter is the master itself (f32, t.param == t.master) they do not
// write it a second time.
#pragma once

#include <cstdint>

#include "peakbound/kernels/cpu/adamw.h"

namespace peakbound::cpu::simd {

void adamw_scalar(const AdamWStepScalars& s, const AdamWTensors& t);
void adamw_avx2(const AdamWStepScalars& s, const AdamWTensors& t, bool stream);
void adamw_avx512(const AdamWStepScalars& s, const AdamWTensors& t, bool stream);

// Whether t's parameter is its master (f32 and the same memory).
inline bool param_is_master(const AdamWTensors& t) {
  return t.param_dtype == DType::f32 && t.param == static_cast<const void*>(t.master);
}

// Elements before t.param's first 64-byte boundary (at most t.n), or -1 when its
// address is not a multiple of its element size (then it is written with plain stores).
inline std::int64_t elements_to_line(const AdamWTensors& t) {
  const auto addr = reinterpret_cast<std::uintptr_t>(t.param);
  const std::uintptr_t size = dtype_size(t.param_dtype);
  if (addr % size != 0) return -1;
  const std::uintptr_t head = ((64 - addr % 64) % 64) / size;
  return head < static_cast<std::uintptr_t>(t.n) ? static_cast<std::int64_t>(head) : t.n;
}

// Adds x[j]^2 (fused) into lanes[j % kSquaresLanes] for j in [0, n).
void squares_scalar(const void* x, DType dtype, std::int64_t n, double* lanes);
void squares_avx2(const void* x, DType dtype, std::int64_t n, double* lanes);
void squares_avx512(const void* x, DType dtype, std::int64_t n, double* lanes);

}  // namespace peakbound::cpu::simd
