#include "peakbound/ops/backend.h"

#include <string>

#include "peakbound/core/error.h"
#ifdef PEAKBOUND_HAVE_CUDA
#include "peakbound/device/cuda/cuda_device.h"
#endif

namespace peakbound::ops {

void no_kernel(const Device& dev, std::string_view op) {
  throw Unavailable("op '" + std::string(op) + "' has no " + std::string(backend_name(dev.backend())) +
                    " kernel yet (device " + dev.name() + ")");
}

#ifdef PEAKBOUND_HAVE_CUDA
void* cuda_stream(Device& dev, Stream& s) {
  auto* d = dynamic_cast<CudaDevice*>(&dev);
  if (!d) throw InvalidArgument("device " + dev.name() + " says cuda but is not a CudaDevice");
  return d->native_stream(s);
}
#endif

}  // namespace peakbound::ops
