// The communicator that moves a device's buffers: the launcher's own (MPI or single
// rank) for the CPU device, whose memory is host memory; NCCL bootstrapped over it for a
// CUDA device (host-memory buffers such as counts still go over the bootstrap; see
// comm/nccl/nccl_communicator.h). Collective over `world`.
#pragma once

#include <memory>

#include "peakbound/comm/communicator.h"
#include "peakbound/device/device.h"

namespace peakbound {

// Throws Unavailable for a CUDA device in a build without NCCL.
std::unique_ptr<Communicator> device_communicator(Device& dev, std::unique_ptr<Communicator> world);

// For a device used beside a group g that stays the host-side group (a bench's paths):
// nullptr on the CPU device (use g itself), on a GPU NCCL bootstrapped over a duplicate
// of g. Collective over g.
std::unique_ptr<Communicator> device_group_for(Device& dev, Communicator& g);

}  // namespace peakbound
