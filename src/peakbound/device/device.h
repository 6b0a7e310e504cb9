// Device: where kernels run and the Arena lives. Work is submitted to streams; work
// on one stream runs in submission order, streams run concurrently, and events
// order them (record on one stream, wait on another). Every device has a compute
// stream and a copy stream (its copy engine); more copy streams can be created.
// Implementations: cpu (device/cpu) and, in CUDA builds, cuda (device/cuda).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/arena.h"
#include "peakbound/device/event.h"

namespace peakbound {

class HostPages;  // core/host_memory.h

enum class CopyKind : std::uint8_t { host_to_device, device_to_host, device_to_device };

// Which kernels a device runs: ops/ dispatches on it (kernels/cpu, kernels/cuda).
enum class Backend : std::uint8_t { cpu, cuda };
std::string_view backend_name(Backend b);

std::string_view copy_kind_name(CopyKind k);

// An ordered queue of work owned by a Device.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& name() const = 0;
};

// Bytes moved and time spent by a device's copy engines, per direction.
struct CopyStats {
  std::uint64_t bytes[3] = {0, 0, 0};  // indexed by CopyKind
  double seconds[3] = {0, 0, 0};       // busy time of the copies
  std::uint64_t copies[3] = {0, 0, 0};
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;
  virtual Backend backend() const = 0;
  virtual Arena& arena() = 0;
  // Allocates from the Arena under component c.
  Buffer allocate(Component c, std::uint64_t bytes) { return arena().allocate(c, bytes); }

  virtual Stream& compute_stream() = 0;
  virtual Stream& copy_stream() = 0;
  // Another stream owned by the device (e.g. a second copy engine for D2H).
  virtual Stream& create_stream(const std::string& name) = 0;

  // Asynchronous copy on stream s; both ranges must stay valid until it completes.
  virtual void memcpy_async(void* dst, const void* src, std::uint64_t bytes, CopyKind kind,
                            Stream& s) = 0;
  // Runs fn on the host in s's order (after the work submitted before it, before the
  // work after it): cudaLaunchHostFunc on CUDA, the stream's thread on the CPU device.
  // A communication thread is a stream from create_stream fed with host tasks.
  virtual void host_task(Stream& s, std::function<void()> fn) = 0;
  // An event that completes when all work submitted to s so far has.
  virtual Event record(Stream& s) = 0;
  // Work submitted to s after this call starts only once e has completed.
  virtual void wait(Stream& s, const Event& e) = 0;
  // Blocks the caller until s (or every stream) is idle; rethrows a failure of its work.
  virtual void synchronize(Stream& s) = 0;
  virtual void synchronize() = 0;

  virtual CopyStats copy_stats() const = 0;

  // The pages a HostMemory beside this device should use (its host side: offloaded
  // optimizer state, checkpoint slots, staging): nullptr for the system allocator (the
  // CPU device), page-locked memory on CUDA. Owned by the device.
  virtual HostPages* host_pages() { return nullptr; }
};

// "cpu" or "cuda"; the budget fixes the Arena's size for the whole run.
// Throws InvalidArgument for an unknown kind, Unavailable for cuda in a CPU-only build,
// OutOfBudget for a cpu budget over the machine's memory (core/system_memory.h: the CPU
// device's arena is RAM, and the OOM killer, not an allocation, would refuse it).
// `name` labels a CPU device (its Arena's errors and reports); a GPU is named cuda:N.
std::unique_ptr<Device> make_device(std::string_view kind, std::uint64_t memory_budget,
                                    const std::string& name = "cpu:0");

// Blocking copies for set-up and read-back, not for hot paths: on the copy stream,
// after the work submitted to the compute stream so far; they return once complete.
// Host code never touches device memory directly (a GPU's is not mapped; see
// core/device_access.h for the CPU device's strict mode that checks it).
void copy_to_device(Device& dev, void* dst, const void* src, std::uint64_t bytes);
void copy_to_host(Device& dev, void* dst, const void* src, std::uint64_t bytes);

}  // namespace peakbound
