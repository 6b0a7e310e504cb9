#include "peakbound/ops/gemm.h"

#include "peakbound/kernels/cpu/gemm.h"
#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/ops/backend.h"
#ifdef PEAKBOUND_HAVE_CUDA
#include "peakbound/kernels/cuda/gemm.h"
#endif

namespace peakbound::ops {

void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  check_device_pointers(dev, "gemm", {a, b, c});
  PB_ON_CUDA(dev, s, cuda::gemm_f32(static_cast<CudaDevice&>(dev), s, trans_a, trans_b, m, n, k, alpha, a, lda, b,
                                     ldb, beta, c, ldc))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "gemm");
  cpu::launch(s, [=] { cpu::gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

}  // namespace peakbound::ops
