#include "peakbound/ops/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "peakbound/core/launcher.h"

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/backend.h"
#ifdef PEAKBOUND_HAVE_CUDA
#include "peakbound/kernels/cuda/gemm.h"
#endif

namespace peakbound::ops {

void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  dispatch(dev, s, "gemm", {a, b, c},
           [&]([[maybe_unused]] void* stream) {
#ifdef PEAKBOUND_HAVE_CUDA  // cuBLAS takes the device (its handle), not only the stream
             cuda::gemm_f32(static_cast<CudaDevice&>(dev), s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                            c, ldc);
#endif
           },
           [=] { cpu::gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

namespace {

// The process's bf16 GEMM path: -1 until first chosen, else a cpu::Bf16GemmPath.
std::atomic<int> g_bf16_path{-1};

cpu::Bf16GemmPath checked_path(std::string_view name, std::string_view where) {
  cpu::Bf16GemmPath p;
  try {
    p = cpu::parse_bf16_gemm_path(name);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(where) + e.what());
  }
  if (!cpu::bf16_gemm_path_supported(p))
    throw Unavailable(std::string(where) + "bf16 GEMM path '" + std::string(name) + "' needs " +
                      std::string(cpu::bf16_gemm_path_needs(p)) + ", which this CPU lacks (use convert)");
  return p;
}

cpu::Bf16GemmPath current_bf16_path() {
  int p = g_bf16_path.load(std::memory_order_relaxed);
  if (p >= 0) return static_cast<cpu::Bf16GemmPath>(p);
  const char* env = std::getenv("PEAKBOUND_BF16_GEMM");
  const cpu::Bf16GemmPath chosen =
      env && *env ? checked_path(env, "PEAKBOUND_BF16_GEMM: ") : cpu::best_bf16_gemm_path();
  g_bf16_path.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

}  // namespace

void gemm_bf16(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc) {
  const cpu::Bf16GemmPath path = dev.backend() == Backend::cpu ? current_bf16_path() : cpu::Bf16GemmPath::convert;
  dispatch(dev, s, "gemm_bf16", {a, b, c},
           [&]([[maybe_unused]] void* stream) {
#ifdef PEAKBOUND_HAVE_CUDA
             cuda::gemm_bf16(static_cast<CudaDevice&>(dev), s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                             c, ldc);
#endif
           },
           [=] { cpu::gemm_bf16(path, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  gemm_bf16(dev, s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool gemm_bf16_takes_wide_a(const Device& dev) {
  return dev.backend() == Backend::cpu && current_bf16_path() == cpu::Bf16GemmPath::convert;
}

void gemm_bf16_wide_a(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha, const float* a, std::int64_t lda, const bf16* b, std::int64_t ldb,
                      float beta, float* c, std::int64_t ldc) {
  if (!gemm_bf16_takes_wide_a(dev))
    throw Unavailable("gemm_bf16_wide_a runs on the CPU's convert path only (device " + dev.name() + ", bf16 path " +
                      bf16_gemm_path() + "): narrow A to bf16 and call gemm_bf16");
  dispatch(dev, s, "gemm_bf16_wide_a", {a, b, c}, [&](void*) { no_kernel(dev, "gemm_bf16_wide_a"); },
           [=] { cpu::gemm_convert_wide_a(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

std::string bf16_gemm_path() { return std::string(cpu::bf16_gemm_path_name(current_bf16_path())); }

void set_bf16_gemm_path(std::string_view name) {
  g_bf16_path.store(static_cast<int>(checked_path(name, "")), std::memory_order_relaxed);
}

std::string blas_core_name() { return cpu::blas_core_name(); }

int blas_num_threads() { return cpu::blas_num_threads(); }

void set_blas_threads(int n) { cpu::set_blas_threads(n); }

BlasThreadsScope::BlasThreadsScope(int n) : before_(blas_num_threads()), n_(n) {
  if (changed()) set_blas_threads(n_);
}

BlasThreadsScope::~BlasThreadsScope() {
  if (changed()) set_blas_threads(before_);
}

std::string blas_core_source() { return cpu::blas_core_source(); }

void prefer_blas_kernels(char** argv) { cpu::prefer_blas_kernels(argv); }

int host_cores_per_rank(int local_ranks) {
  return std::max(1, default_thread_count() / std::max(1, local_ranks));
}

void share_host_cores_among_local_ranks() { cpu::set_blas_threads(host_cores_per_rank(launcher_local_size())); }

}  // namespace peakbound::ops
