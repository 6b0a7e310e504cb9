// The op layer's dispatch: every op in ops/ takes the Device and a Stream of it and
// runs the kernel of the device's backend (kernels/cpu now, kernels/cuda once that
// backend lands). A backend without the op fails with Unavailable naming both, so a
// build without CUDA always links and says clearly what is missing (mlx's no_gpu).
#pragma once

#include <initializer_list>
#include <string_view>

#include "peakbound/device/device.h"

namespace peakbound::ops {

// Throws Unavailable: "op 'gemm' has no cuda kernel yet (device cuda:0)".
[[noreturn]] void no_kernel(const Device& dev, std::string_view op);

// Under strict device memory (PEAKBOUND_STRICT_DEVICE=1, core/device_access.h) on the
// CPU device: throws InternalError when a non-null pointer an op is given lies outside
// the device's memory (host memory a GPU kernel could not read). Otherwise nothing.
void check_device_pointers(Device& dev, std::string_view op, std::initializer_list<const void*> ptrs);

#ifdef PEAKBOUND_HAVE_CUDA
// The cudaStream_t behind s, a stream of the CUDA device dev.
void* cuda_stream(Device& dev, Stream& s);
// The CUDA device's mapped pinned result slot (CudaDevice::result_slot), where a kernel
// leaves a small result the host reads after synchronizing.
double* cuda_result_slot(Device& dev);
#endif

}  // namespace peakbound::ops

// In an op: on a CUDA device run `call` (which may use `stream`, the cudaStream_t) and
// return; in a build without CUDA this is nothing, and the op's no_kernel check speaks.
#ifdef PEAKBOUND_HAVE_CUDA
#define PB_ON_CUDA(dev, s, call)                                    \
  if ((dev).backend() == ::peakbound::Backend::cuda) {              \
    [[maybe_unused]] void* stream = ::peakbound::ops::cuda_stream(dev, s); \
    call;                                                           \
    return;                                                         \
  }
#else
#define PB_ON_CUDA(dev, s, call)
#endif

namespace peakbound::ops {

}  // namespace peakbound::ops
