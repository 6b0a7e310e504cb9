#include "peakbound/kernels/cpu/gemm.h"

#include <cblas.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // libgcc's cpuid, with XGETBV: a feature the OS does not save reads false
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

std::string blas_core_for(const CpuFeatures& f) {
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (avx512 && f.avx512bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  return "";
}

bool blas_core_is_generic(const std::string& name) {
  for (const char* g : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
                        "Northwood", "Banias", "unknown"})
    if (name == g) return true;
  return false;
}

std::string blas_core_source() { return std::getenv("OPENBLAS_CORETYPE") != nullptr ? "OPENBLAS_CORETYPE" : "detected"; }

void prefer_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || !blas_core_is_generic(blas_core_name())) return;
  const std::string core = blas_core_for(cpu_features());
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Only on failure: the run goes on, with the generic kernels.
  std::fprintf(stderr, "peakbound: warning: OpenBLAS chose its generic %s kernels on this CPU, and re-executing with "
                       "OPENBLAS_CORETYPE=%s failed (%s); f32 GEMMs run several times slower\n",
               blas_core_name().c_str(), core.c_str(), std::strerror(errno));
}

int blas_num_threads() { return openblas_get_num_threads(); }

void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

bool park_blas_threads() {
  using Shutdown = int (*)();
  static const Shutdown shutdown = [] {
    void* f = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
    Shutdown s = nullptr;
    static_assert(sizeof(s) == sizeof(f));
    std::memcpy(&s, &f, sizeof(s));
    return s;
  }();
  if (shutdown == nullptr) return false;
  shutdown();
  return true;
}

}  // namespace peakbound::cpu
