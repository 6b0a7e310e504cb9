#include "peakbound/ops/backend.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound::ops {

void no_kernel(const Device& dev, std::string_view op) {
  throw Unavailable("op '" + std::string(op) + "' has no " + std::string(backend_name(dev.backend())) +
                    " kernel yet (device " + dev.name() + ")");
}

}  // namespace peakbound::ops
