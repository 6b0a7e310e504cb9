// GEMM through the device's backend (OpenBLAS on the CPU device), row-major:
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. WRITES C (beta = 0) or ADDS INTO it
// (beta = 1). With trans_a, A is stored [K,M]; with trans_b, B is stored [N,K]. Leading
// dimensions are row strides. C, alpha and beta are fp32 in both forms; A and B are f32 or
// both bf16 (overload resolution picks the form by their pointer type), and bf16 operands
// accumulate in fp32: each product of two bf16 values is exact in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

// The same product with bf16 A and B, accumulated in fp32 into the f32 C (the mixed-
// precision GEMM): on the CPU device kernels/cpu/gemm_bf16.h on the path below, on
// CUDA cuBLAS's GemmEx (bf16 inputs, CUBLAS_COMPUTE_32F). The gemm overload below is this
// call; code written over both operand types (template <class A>) calls gemm.
void gemm_bf16(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc);
void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

// gemm_bf16 with A given widened: `a` holds fp32 values each exactly a bf16 (round_bf16,
// ops/elementwise.h, leaves them so). Runs where gemm_bf16_takes_wide_a: the CPU device on
// the convert path, where it is the same product bit for bit as gemm_bf16 on A narrowed,
// without the narrowed copy and its widening (kernels/cpu/gemm_bf16.h's
// gemm_convert_wide_a); elsewhere Unavailable: narrow A and call gemm_bf16 there.
bool gemm_bf16_takes_wide_a(const Device& dev);
void gemm_bf16_wide_a(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha, const float* a, std::int64_t lda, const bf16* b, std::int64_t ldb,
                      float beta, float* c, std::int64_t ldc);

// The CPU path of gemm_bf16 for this process: "amx" (AMX tile products), "native"
// (AVX512-BF16 dot products) or "convert" (blocks widened to f32 for sgemm). Chosen on
// first use: the environment's PEAKBOUND_BF16_GEMM when set (an unknown name, or a path
// this CPU cannot run, is a one-line error then), else amx where the CPU has AMX-BF16 and
// the kernel lets the process use it, else native where an AMD CPU has AVX512-BF16, else
// convert (kernels/cpu/gemm_bf16.h says why).
std::string bf16_gemm_path();
// Sets it: InvalidArgument for an unknown name, Unavailable for one this CPU cannot run.
void set_bf16_gemm_path(std::string_view name);

// The host's BLAS (OpenBLAS, run by the CPU device and host compute): the core type its
// kernels were chosen for ("Haswell", "SkylakeX", ...) and its thread count.
std::string blas_core_name();
int blas_num_threads();
// Sets the thread count (at least 1; gemm_bf16's pool follows it).
void set_blas_threads(int n);
// The BLAS on `n` threads for a scope, its count before restored at the end (neither call
// made where the count is already n).
class BlasThreadsScope {
 public:
  explicit BlasThreadsScope(int n);
  ~BlasThreadsScope();
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;
  bool changed() const { return before_ != n_; }

 private:
  int before_, n_;
};
// Where the core type came from: "detected" (OpenBLAS's choice) or "OPENBLAS_CORETYPE".
std::string blas_core_source();
// First thing in a program's main(): where OpenBLAS fell back to its generic kernels on a
// CPU newer than it knows, re-executes the program with the kernels the CPU allows
// (kernels/cpu/gemm.h, prefer_blas_kernels).
void prefer_blas_kernels(char** argv);

// The host's BLAS threads shared among the ranks the launcher put on this machine
// (hardware threads / local ranks, at least 1), so co-located ranks do not oversubscribe.
void share_host_cores_among_local_ranks();
// That share for `local_ranks` ranks on this machine: hardware threads / local_ranks, at
// least 1.
int host_cores_per_rank(int local_ranks);

}  // namespace peakbound::ops
