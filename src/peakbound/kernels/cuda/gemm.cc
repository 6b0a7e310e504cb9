#include "peakbound/kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <limits>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound::cuda {

namespace {

int as_int(std::int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw InvalidArgument(std::string("cuda gemm: ") + what + " = " + std::to_string(v) + " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuda gemm: ") + what + ": " + cublasGetStatusString(st));
}

}  // namespace

void gemm_f32(CudaDevice& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
              std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  auto h = static_cast<cublasHandle_t>(dev.blas_handle());
  check_blas(cublasSetStream(h, static_cast<cudaStream_t>(dev.native_stream(s))), "cublasSetStream");
  // With k = 0 a row stride may be 0, which cuBLAS refuses; nothing is read then.
  if (k == 0) lda = std::max<std::int64_t>(lda, 1), ldb = std::max<std::int64_t>(ldb, 1);
  // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T: swap the operands.
  check_blas(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(n, "n"),
                    as_int(m, "m"), as_int(k, "k"), &alpha, b, as_int(ldb, "ldb"), a, as_int(lda, "lda"), &beta, c,
                    as_int(ldc, "ldc")),
        "cublasSgemm");
}

void gemm_bf16(CudaDevice& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  auto h = static_cast<cublasHandle_t>(dev.blas_handle());
  check_blas(cublasSetStream(h, static_cast<cudaStream_t>(dev.native_stream(s))), "cublasSetStream");
  if (k == 0) lda = std::max<std::int64_t>(lda, 1), ldb = std::max<std::int64_t>(ldb, 1);
  // Row-major as column-major with the operands swapped, as in gemm_f32.
  check_blas(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          as_int(n, "n"), as_int(m, "m"), as_int(k, "k"), &alpha, b, CUDA_R_16BF, as_int(ldb, "ldb"), a,
                          CUDA_R_16BF, as_int(lda, "lda"), &beta, c, CUDA_R_32F, as_int(ldc, "ldc"),
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx (bf16)");
}

}  // namespace peakbound::cuda
