#include "peakbound/ops/host_adamw.h"

#include "peakbound/kernels/cpu/adamw.h"

namespace peakbound::ops {

void host_adamw_update(ThreadPool& pool, SimdLevel simd, const AdamWStepScalars& s, const AdamWTensors& t) {
  cpu::adamw_update_parallel(pool, simd, s, t);
}

double host_sum_squares(ThreadPool& pool, SimdLevel simd, const void* x, DType dtype, std::int64_t n) {
  return cpu::sum_squares(pool, simd, x, dtype, n);
}

}  // namespace peakbound::ops
