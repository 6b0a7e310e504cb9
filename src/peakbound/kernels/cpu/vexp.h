// Vectorised exp for the softmax-shaped loops of the CPU kernels (flash attention's
// probabilities, the cross-entropy's log-sum-exp and gradient): Cephes' expf (a degree-6
// polynomial after a Cody-Waite reduction by ln 2, within 2 ulp of the exact value over
// the range used; tested against double), sixteen lanes at a time with AVX-512, eight with
// AVX2 + FMA, else a scalar body that does the same operations in the same order with
// std::fma (compiled to the FMA instruction where the CPU has it, a libm call elsewhere),
// so all give the same bits (and so does every CPU kind).
//
// Every function takes t = x - shift: t below ln(FLT_MIN) (-87.34, and -inf: a masked
// score) gives 0 (denormal results are flushed, a relative change below 1e-38 of the row's
// sum); t above 88 is taken as 88 (the kernels shift by the row's maximum, so t <= 0); NaN
// stays NaN. Sums run over 8 lanes (element j into lane j % 8, in order), then the fixed
// tree ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)).
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

// exp(t) for one value: the same bits as one lane of the functions below.
float exp_f32(float t);
// x[j] = exp(x[j] - shift) for j in [0, n).
void exp_shift(float* x, std::int64_t n, float shift);
// The same, and low[j] = narrow<bf16>(the new x[j]) (the flash backward's P in both forms).
void exp_shift(float* x, bf16* low, std::int64_t n, float shift);
// The same with the rounded copy held in fp32: low[j] = widen(narrow<bf16>(the new x[j]))
// (the bf16 value as the convert path's GEMM would widen it; bits as the form above).
void exp_shift(float* x, float* low, std::int64_t n, float shift);
// x[j] = exp(x[j] - shift), returning the sum of the new x[j] (the lane order above).
float exp_shift_sum(float* x, std::int64_t n, float shift);
// low[j] = narrow<bf16>(exp(x[j] - shift)) for j in [0, n), x unchanged, returning the sum
// of the unrounded values (exp_shift_sum's bits): flash attention's probabilities go
// straight to the bf16 operand of O += P V.
float exp_shift_sum(bf16* low, const float* x, std::int64_t n, float shift);
// The same with low[j] = widen(narrow<bf16>(exp(x[j] - shift))) in fp32; low may be x (each
// block is read before it is written).
float exp_shift_sum(float* low, const float* x, std::int64_t n, float shift);
// x[j] = exp(x[j] - shift[j]) and low[j] = narrow<bf16>(the new x[j]) for j in [0, n): a
// shift per element (the flash backward along a key row, each query's log-sum-exp), each
// value exp_f32(x[j] - shift[j])'s bits.
void exp_shifts(float* x, bf16* low, std::int64_t n, const float* shift);
// The sum of exp(x[j] - shift) over [0, n), x unchanged.
float sum_exp_shift(const float* x, std::int64_t n, float shift);
// The largest x[j] over [0, n) (NaNs skipped, as `x[j] > m ? x[j] : m` skips them); -inf for n = 0.
float row_max(const float* x, std::int64_t n);

}  // namespace peakbound::cpu
