#include "peakbound/device/device.h"

#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/system_memory.h"
#include "peakbound/core/units.h"
#include "peakbound/device/cpu/cpu_device.h"
#ifdef PEAKBOUND_HAVE_CUDA
#include "peakbound/device/cuda/cuda_device.h"
#endif

namespace peakbound {

std::string_view copy_kind_name(CopyKind k) {
  switch (k) {
    case CopyKind::host_to_device: return "h2d";
    case CopyKind::device_to_host: return "d2h";
    case CopyKind::device_to_device: return "d2d";
  }
  PB_CHECK_MSG(false, "unknown copy kind");
}

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  PB_CHECK_MSG(false, "unknown backend");
}

std::unique_ptr<Device> make_device(std::string_view kind, std::uint64_t memory_budget, const std::string& name) {
  if (kind == "cpu") {
    // The CPU device's arena is RAM, committed page by page as it fills: a budget over
    // the machine's memory would not be refused by any allocation, the OOM killer would
    // end the process instead. A GPU's budget is checked by its cudaMalloc.
    const MachineMemory m = machine_memory();
    if (m.bytes > 0 && memory_budget > m.bytes)
      throw OutOfBudget("cpu device: a budget of " + format_bytes(static_cast<double>(memory_budget)) +
                        " is over this machine's memory, " + format_bytes(static_cast<double>(m.bytes)) + " (" +
                        m.source + "; the cpu device's arena is RAM); lower --device-memory");
    return std::make_unique<CpuDevice>(memory_budget, name);
  }
  if (kind == "cuda") {
#ifdef PEAKBOUND_HAVE_CUDA
    return std::make_unique<CudaDevice>(memory_budget);
#else
    throw Unavailable("this peakbound was built without CUDA (PEAKBOUND_WITH_CUDA=OFF); use --device cpu");
#endif
  }
  throw InvalidArgument("unknown device '" + std::string(kind) + "' (use cpu or cuda)");
}

namespace {
void copy_and_wait(Device& dev, void* dst, const void* src, std::uint64_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  Stream& s = dev.copy_stream();
  dev.wait(s, dev.record(dev.compute_stream()));
  dev.memcpy_async(dst, src, bytes, kind, s);
  dev.synchronize(s);
}
}  // namespace

void copy_to_device(Device& dev, void* dst, const void* src, std::uint64_t bytes) {
  copy_and_wait(dev, dst, src, bytes, CopyKind::host_to_device);
}

void copy_to_host(Device& dev, void* dst, const void* src, std::uint64_t bytes) {
  copy_and_wait(dev, dst, src, bytes, CopyKind::device_to_host);
}

}  // namespace peakbound
