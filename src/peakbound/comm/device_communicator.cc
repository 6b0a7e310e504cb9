#include "peakbound/comm/device_communicator.h"

#include "peakbound/core/error.h"

#ifdef PEAKBOUND_HAVE_NCCL
#include "peakbound/comm/nccl/nccl_communicator.h"
#endif

namespace peakbound {

std::unique_ptr<Communicator> device_communicator(Device& dev, std::unique_ptr<Communicator> world) {
  if (dev.backend() == Backend::cpu) return world;
#ifdef PEAKBOUND_HAVE_NCCL
  return std::make_unique<NcclCommunicator>(static_cast<CudaDevice&>(dev), std::move(world));
#else
  throw Unavailable("device " + dev.name() + " needs NCCL to move its buffers, and this peakbound was built without it");
#endif
}

std::unique_ptr<Communicator> device_group_for(Device& dev, Communicator& g) {
  if (dev.backend() == Backend::cpu) return nullptr;
  return device_communicator(dev, g.split(0, g.rank()));
}

}  // namespace peakbound
