#include "peakbound/ops/backend.h"

#include <cstdio>
#include <string>

#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"
#ifdef PEAKBOUND_HAVE_CUDA
#include "peakbound/device/cuda/cuda_device.h"
#endif

namespace peakbound::ops {

void no_kernel(const Device& dev, std::string_view op) {
  throw Unavailable("op '" + std::string(op) + "' has no " + std::string(backend_name(dev.backend())) +
                    " kernel yet (device " + dev.name() + ")");
}

void check_device_pointers(Device& dev, std::string_view op, std::initializer_list<const void*> ptrs) {
  if (!strict_device_memory() || dev.backend() != Backend::cpu) return;
  for (const void* p : ptrs)
    if (p && !dev.arena().holds(p)) {
      char at[32];
      std::snprintf(at, sizeof at, "%p", p);
      throw InternalError("op '" + std::string(op) + "' was given " + at + ", which is not memory of device " +
                          dev.name() + " (PEAKBOUND_STRICT_DEVICE=1): a GPU kernel could not read it");
    }
}

#ifdef PEAKBOUND_HAVE_CUDA
void* cuda_stream(Device& dev, Stream& s) {
  auto* d = dynamic_cast<CudaDevice*>(&dev);
  if (!d) throw InvalidArgument("device " + dev.name() + " says cuda but is not a CudaDevice");
  return d->native_stream(s);
}

double* cuda_result_slot(Device& dev) {
  auto* d = dynamic_cast<CudaDevice*>(&dev);
  if (!d) throw InvalidArgument("device " + dev.name() + " says cuda but is not a CudaDevice");
  return d->result_slot();
}
#endif

}  // namespace peakbound::ops
