// CPU GEMM through OpenBLAS (cblas_sgemm), row-major.
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. With trans_a, A is stored
// [K,M]; with trans_b, B is stored [N,K]. Leading dimensions are row strides.
#pragma once

#include <cstdint>
#include <string>

#include "peakbound/core/tensor.h"

namespace peakbound::cpu {

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc);

// Tensor form for contiguous 2-D f32 tensors; checks shapes, throws InternalError on mismatch.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);

// The OpenBLAS kernel family in use (openblas_get_corename()), e.g. "Haswell".
std::string blas_core_name();
// OpenBLAS's thread count, and setting it (several ranks on few cores want 1 each).
int blas_num_threads();
void set_blas_threads(int n);

}  // namespace peakbound::cpu
