// Small elementwise CPU kernels and the exactness metric the tests and `verify` use.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

void fill(float* x, std::int64_t n, float v);
void scale(float* x, std::int64_t n, float a);              // x *= a
void axpy(float* y, const float* x, std::int64_t n, float a);  // y += a * x
void add(float* out, const float* a, const float* b, std::int64_t n);
void to_bf16(bf16* out, const float* in, std::int64_t n);
void to_f32(float* out, const bf16* in, std::int64_t n);

// max |x|
double max_abs(const float* x, std::int64_t n);
// max |a - b|
double max_abs_diff(const float* a, const float* b, std::int64_t n);
// The project's relative error: max|a - ref| / max|ref| over the whole tensor (the
// plain max|a - ref| when ref is all zeros). NaN anywhere gives NaN, never a pass.
double relative_error(const float* a, const float* ref, std::int64_t n);

}  // namespace peakbound::cpu
