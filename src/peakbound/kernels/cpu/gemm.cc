#include "peakbound/kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>

#include "peakbound/core/error.h"

namespace peakbound::cpu {

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc) {
  PB_CHECK(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return;
  PB_CHECK_MSG(ldc >= n, "ldc < n");
  if (k == 0) {
    // Nothing to multiply: C = beta * C (BLAS's own K=0 handling varies by version).
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  PB_CHECK_MSG(lda >= (trans_a ? m : k), "lda too small");
  PB_CHECK_MSG(ldb >= (trans_b ? k : n), "ldb too small");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            float alpha, float beta) {
  PB_CHECK_MSG(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "matmul takes 2-D tensors");
  std::int64_t m = trans_a ? a.dim(1) : a.dim(0);
  std::int64_t k = trans_a ? a.dim(0) : a.dim(1);
  std::int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  std::int64_t n = trans_b ? b.dim(0) : b.dim(1);
  PB_CHECK_MSG(k == kb && c.dim(0) == m && c.dim(1) == n,
               "matmul shapes " + a.shape().str() + (trans_a ? "^T" : "") + " x " +
                   b.shape().str() + (trans_b ? "^T" : "") + " -> " + c.shape().str());
  gemm_f32(trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
           beta, c.data<float>(), c.dim(1));
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

int blas_num_threads() { return openblas_get_num_threads(); }

void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

}  // namespace peakbound::cpu
