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

// OpenBLAS built for every x86 CPU (DYNAMIC_ARCH, as Debian ships it) chooses its kernels
// once, as it loads, from the CPU's family and model. A CPU newer than the library (Debian
// 12's 0.3.21 on a 5th-generation Xeon, family 6 model 207) gets its fallback, the SSE3
// Prescott kernels: f32 GEMMs at a quarter of the AVX-512 ones' rate (50 against 216
// GFLOP/s on 2 cores). The kernels the CPU's features (with the OS's support) allow:
// Cooperlake with AVX512-BF16, SkylakeX with AVX-512 (F, BW, VL, DQ), Haswell with AVX2 and
// FMA, else none ("").
struct CpuFeatures {
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false,
       avx512bf16 = false;
};
CpuFeatures cpu_features();
std::string blas_core_for(const CpuFeatures& f);
// Whether `name` is one of OpenBLAS's pre-AVX cores (its fallback Prescott and older).
bool blas_core_is_generic(const std::string& name);
// What prefer_blas_kernels decided (for `peakbound info`): "detected" (OpenBLAS's own
// choice kept), "OPENBLAS_CORETYPE" (set by the user, or by this program before it
// re-executed itself).
std::string blas_core_source();
// Called first thing in main(): when OpenBLAS fell back to a generic core on a CPU that
// allows better kernels and OPENBLAS_CORETYPE is unset, sets it to blas_core_for() and
// re-executes the program (/proc/self/exe, the same arguments and pid: before MPI is
// initialised, mpirun's ranks included) so that OpenBLAS loads with those kernels. Returns
// when there is nothing to do, or when the exec fails (a one-line warning on stderr; the run
// goes on with the generic kernels). A value the user set is kept as it is.
void prefer_blas_kernels(char** argv);
// OpenBLAS's thread count, and setting it (several ranks on few cores want 1 each).
int blas_num_threads();
void set_blas_threads(int n);
// OpenBLAS's idle worker threads stopped now, not after their polling timeout (2^28
// cycles by default, ~0.1 s of sched_yield after every threaded call): its
// blas_thread_shutdown_, found at run time (what its fork handler calls; its next threaded
// call starts them again). False, doing nothing, where the library has no such function.
bool park_blas_threads();

}  // namespace peakbound::cpu
