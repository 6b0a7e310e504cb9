// Strict device memory: a CPU device that behaves like a GPU towards host code, to
// find the host code that would break on a GPU without having one. With
// PEAKBOUND_STRICT_DEVICE=1 a CPU device keeps its memory inaccessible (PROT_NONE)
// except while device work runs: kernels, copies and host tasks on its streams, and a
// communicator moving buffers (which a GPU does with NCCL). Host code that reads or
// writes device memory directly then faults at the access, and the fault handler
// prints "host code touched device memory" with the address and a backtrace
// (addresses resolve with addr2line) before the process dies.
//
// The window is process-wide: while any device work runs, every thread may touch the
// memory, so a stray access can slip through when it overlaps device work on another
// thread; one that does not is always caught. Off (the default) it costs one atomic
// load per kernel.
#pragma once

#include <cstddef>

namespace peakbound {

// Whether PEAKBOUND_STRICT_DEVICE=1 (read once).
bool strict_device_memory();

// A region of device memory to keep closed outside device work (strict mode only).
void strict_region_add(void* p, std::size_t bytes);
void strict_region_remove(void* p);

// Opens every strict region for its lifetime (nestable, any thread).
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  bool active_ = false;
};

}  // namespace peakbound
