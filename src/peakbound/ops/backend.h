// The op layer's dispatch: every op in ops/ takes the Device and a Stream of it and
// runs the kernel of the device's backend (kernels/cpu, kernels/cuda) through
// dispatch() below. A backend without the op fails with Unavailable naming both, so a
// build without CUDA always links and says clearly what is missing (mlx's no_gpu).
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "peakbound/device/device.h"
#include "peakbound/kernels/cpu/launch.h"

namespace peakbound::ops {

// Throws Unavailable: "op 'gemm' has no cuda kernel yet (device cuda:0)".
[[noreturn]] void no_kernel(const Device& dev, std::string_view op);

// Under strict device memory (PEAKBOUND_STRICT_DEVICE=1, core/device_access.h) on the
// CPU device: throws InternalError when a non-null pointer an op is given lies outside
// the device's memory (host memory a GPU kernel could not read). Otherwise nothing.
void check_device_pointers(Device& dev, std::string_view op, std::initializer_list<const void*> ptrs);

// The cudaStream_t behind s, a stream of the CUDA device dev.
void* cuda_stream(Device& dev, Stream& s);
// The CUDA device's mapped pinned result slot (CudaDevice::result_slot), where a kernel
// leaves a small result the host reads after synchronizing. Both are defined in a CUDA
// build only: the CUDA branch of an op, the only caller, is never called without one.
double* cuda_result_slot(Device& dev);

}  // namespace peakbound::ops

namespace peakbound::ops {

// The one dispatch every op goes through:
//   dispatch(dev, s, "fill", {x},
//            [&](void* stream) { cuda::fill(stream, x, n, v); },  // CUDA: runs now, enqueues on stream
//            [=] { cpu::fill(x, n, v); });                          // CPU: launched on s
// It checks the pointers (check_device_pointers), then on a CUDA device calls
// on_cuda(the cudaStream_t of s), on the CPU device launches on_cpu on s (now on the
// compute stream, queued on a worker stream: kernels/cpu/launch.h), and on any other
// backend throws no_kernel. on_cpu must capture by value: it may run after the op
// returns. In a build without CUDA on_cuda is never called (nor compiled to code).
// With `check` (the form with seven arguments) check() runs on the caller's thread after
// the pointer check and before either backend, so bad arguments fail at the call and not
// on a worker stream.
template <class OnCuda, class OnCpu>
void dispatch(Device& dev, Stream& s, std::string_view op, std::initializer_list<const void*> ptrs,
              [[maybe_unused]] OnCuda&& on_cuda, OnCpu&& on_cpu) {
  check_device_pointers(dev, op, ptrs);
#ifdef PEAKBOUND_HAVE_CUDA
  if (dev.backend() == Backend::cuda) return on_cuda(cuda_stream(dev, s));
#endif
  if (dev.backend() != Backend::cpu) no_kernel(dev, op);
  cpu::launch(s, std::forward<OnCpu>(on_cpu));
}

template <class Check, class OnCuda, class OnCpu>
void dispatch(Device& dev, Stream& s, std::string_view op, std::initializer_list<const void*> ptrs, Check&& check,
              OnCuda&& on_cuda, OnCpu&& on_cpu) {
  check_device_pointers(dev, op, ptrs);
  check();
  dispatch(dev, s, op, {}, std::forward<OnCuda>(on_cuda), std::forward<OnCpu>(on_cpu));
}

// The same for an op whose result the host reads (a loss, a norm): on_cuda(stream)
// leaves it in the device's result slot (cuda_result_slot), synchronizes and returns
// it; on_cpu() computes it on s while the caller waits (cpu::launch_and_wait) and may
// capture by reference. With `check`, as dispatch.
template <class R, class OnCuda, class OnCpu>
R dispatch_result(Device& dev, Stream& s, std::string_view op, std::initializer_list<const void*> ptrs,
                  [[maybe_unused]] OnCuda&& on_cuda, OnCpu&& on_cpu) {
  check_device_pointers(dev, op, ptrs);
#ifdef PEAKBOUND_HAVE_CUDA
  if (dev.backend() == Backend::cuda) return on_cuda(cuda_stream(dev, s));
#endif
  if (dev.backend() != Backend::cpu) no_kernel(dev, op);
  R r{};
  cpu::launch_and_wait(s, [&] { r = on_cpu(); });
  return r;
}

template <class R, class Check, class OnCuda, class OnCpu>
R dispatch_result(Device& dev, Stream& s, std::string_view op, std::initializer_list<const void*> ptrs, Check&& check,
                  OnCuda&& on_cuda, OnCpu&& on_cpu) {
  check_device_pointers(dev, op, ptrs);
  check();
  return dispatch_result<R>(dev, s, op, {}, std::forward<OnCuda>(on_cuda), std::forward<OnCpu>(on_cpu));
}

}  // namespace peakbound::ops
