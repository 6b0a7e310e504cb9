#include "peakbound/ops/gemm.h"

#include <algorithm>
#include <thread>

#include "peakbound/core/launcher.h"

#include "peakbound/kernels/cpu/gemm.h"
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

std::string blas_core_name() { return cpu::blas_core_name(); }

int blas_num_threads() { return cpu::blas_num_threads(); }

void share_host_cores_among_local_ranks() {
  cpu::set_blas_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / launcher_local_size()));
}

}  // namespace peakbound::ops
