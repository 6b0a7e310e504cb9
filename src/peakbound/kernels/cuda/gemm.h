// GEMM on the CUDA device through cuBLAS, row-major f32 with the op layer's contract
// (ops/gemm.h): C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, C written (beta 0)
// or added into (beta 1); A, B read. All three are device memory. cuBLAS is
// column-major, so the row-major product is computed as its transpose:
// C^T[N,M] = op(B)^T op(A)^T, i.e. cublasSgemm with the operands swapped.
// Math mode is CUBLAS_PEDANTIC_MATH (no TF32): f32 results comparable with the CPU
// backend's at f32 tolerance. gemm_bf16 below is the mixed-precision product.
// Runs on stream s (cublasSetStream); one cuBLAS handle per device, created on first use.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/cuda/cuda_device.h"

namespace peakbound::cuda {

void gemm_f32(CudaDevice& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
              std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc);

// The mixed-precision product: A and B bf16, C f32, accumulated in fp32
// (cublasGemmEx with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F; cuBLAS runs it on
// cuBLASLt's bf16 tensor-core kernels). Same contract as gemm_f32.
void gemm_bf16(CudaDevice& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc);

}  // namespace peakbound::cuda
