#include "peakbound/ops/adamw.h"

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/adamw.h"
#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cuda/adamw.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void adamw_update(Device& dev, Stream& s, const AdamWStepScalars& sc, const AdamWTensors& t,
                  const AdamWLaunch& l) {
  check_device_pointers(dev, "adamw_update", {t.master, t.m, t.v, t.grad, t.param});
  PB_ON_CUDA(dev, s, cuda::adamw_update(stream, sc, t))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "adamw_update");
  PB_CHECK_MSG(l.pool, "adamw_update on the cpu backend needs a thread pool");
  cpu::launch(s, [=] { cpu::adamw_update_parallel(*l.pool, l.simd, sc, t); });
}

double sum_squares(Device& dev, Stream& s, const void* x, DType dtype, std::int64_t n, const AdamWLaunch& l) {
  check_device_pointers(dev, "sum_squares", {x});
#ifdef PEAKBOUND_HAVE_CUDA
  if (dev.backend() == Backend::cuda) {
    double* slot = cuda_result_slot(dev);
    cuda::sum_squares(cuda_stream(dev, s), x, dtype, n, slot);
    dev.synchronize(s);
    return slot[0];
  }
#endif
  if (dev.backend() != Backend::cpu) no_kernel(dev, "sum_squares");
  PB_CHECK_MSG(l.pool, "sum_squares on the cpu backend needs a thread pool");
  double out = 0;
  cpu::launch_and_wait(s, [&] { out = cpu::sum_squares(*l.pool, l.simd, x, dtype, n); });
  return out;
}

}  // namespace peakbound::ops
