#include "peakbound/ops/adamw.h"

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/adamw.h"
#include "peakbound/kernels/cuda/adamw.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void adamw_update(Device& dev, Stream& s, const AdamWStepScalars& sc, const AdamWTensors& t,
                  const AdamWLaunch& l) {
  dispatch(dev, s, "adamw_update", {t.master, t.m, t.v, t.grad, t.param},
           [&] {  // the CPU kernel runs on the launch's pool; a CUDA device has no use for one
             if (dev.backend() == Backend::cpu)
               PB_CHECK_MSG(l.pool, "adamw_update on the cpu backend needs a thread pool");
           },
           [&](void* stream) { cuda::adamw_update(stream, sc, t); },
           [=] { cpu::adamw_update_parallel(*l.pool, l.simd, sc, t); });
}

double sum_squares(Device& dev, Stream& s, const void* x, DType dtype, std::int64_t n, const AdamWLaunch& l) {
  return dispatch_result<double>(
      dev, s, "sum_squares", {x},
      [&] {
        if (dev.backend() == Backend::cpu) PB_CHECK_MSG(l.pool, "sum_squares on the cpu backend needs a thread pool");
      },
      [&](void* stream) {
        double* slot = cuda_result_slot(dev);
        cuda::sum_squares(stream, x, dtype, n, slot);
        dev.synchronize(s);
        return slot[0];
      },
      [&] { return cpu::sum_squares(*l.pool, l.simd, x, dtype, n); });
}

}  // namespace peakbound::ops
