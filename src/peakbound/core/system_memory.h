// The machine's memory, and whether a run's planned use of it fits: the physical memory
// (MemTotal of /proc/meminfo), lowered to the process's cgroup limit when one is set
// (cgroup v2 memory.max unless "max", or v1 memory.limit_in_bytes). A run that plans
// more than that would not be refused by any allocator: pages are committed when first
// touched, so the kernel's OOM killer would end it minutes in. The CPU device's arena
// is host memory (its budget counts), a GPU's is not (only the host side counts), and
// the ranks a launcher starts on one machine share it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace peakbound {

struct MachineMemory {
  std::uint64_t bytes = 0;  // 0: unknown (no /proc/meminfo): nothing is checked
  std::string source;       // "MemTotal", "the cgroup limit"
};

// MemTotal of a /proc/meminfo text in bytes, 0 when it holds none.
std::uint64_t meminfo_total_bytes(std::string_view meminfo);
// A cgroup limit file's value in bytes (memory.max, memory.limit_in_bytes); nullopt for
// "max", an empty or malformed text, or a value so large it means "no limit" (cgroup v1
// writes one near 2^63).
std::optional<std::uint64_t> cgroup_limit_bytes(std::string_view text);
// The smaller of MemTotal and the cgroup limit. `root` prefixes the paths read (tests).
MachineMemory machine_memory(const std::string& root = "");

// What one rank of a run plans to hold in the machine's memory.
struct MachineNeed {
  std::uint64_t device_bytes = 0;  // the arena's budget when it is host memory (CPU device), else 0
  std::uint64_t host_bytes = 0;    // host-side memory: offloaded state, staging, checkpoint copies, batches
  int local_ranks = 1;             // ranks sharing this machine (each planning as much)
  std::uint64_t total() const;     // (device + host) x local ranks, saturating
};

// Throws InvalidArgument, one line naming the planned bytes, the machine's memory and
// `fix`, when need.total() exceeds machine.bytes (nothing when machine.bytes is 0).
void check_fits_machine(const MachineNeed& need, const MachineMemory& machine, std::string_view fix);

}  // namespace peakbound
