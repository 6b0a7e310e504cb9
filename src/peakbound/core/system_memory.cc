#include "peakbound/core/system_memory.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return s.str().substr(0, 1 << 20);
}

// Leading decimal digits of `t` (after blanks) as a number; nullopt when none or too large.
std::optional<std::uint64_t> leading_number(std::string_view t) {
  std::size_t i = 0;
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
  if (i == t.size() || !std::isdigit(static_cast<unsigned char>(t[i]))) return std::nullopt;
  std::uint64_t v = 0;
  for (; i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); ++i) {
    const std::uint64_t d = static_cast<std::uint64_t>(t[i] - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

}  // namespace

std::uint64_t meminfo_total_bytes(std::string_view meminfo) {
  std::size_t at = 0;
  while (at < meminfo.size()) {
    const std::size_t end = std::min(meminfo.find('\n', at), meminfo.size());
    const std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.rfind("MemTotal:", 0) != 0) continue;
    const std::optional<std::uint64_t> kib = leading_number(line.substr(9));
    if (!kib || *kib > std::numeric_limits<std::uint64_t>::max() / 1024) return 0;
    return *kib * 1024;  // the kernel writes "kB", meaning KiB
  }
  return 0;
}

std::optional<std::uint64_t> cgroup_limit_bytes(std::string_view text) {
  const std::optional<std::uint64_t> v = leading_number(text);
  // cgroup v1's "unlimited" is PAGE_COUNTER_MAX pages in bytes, about 2^63.
  if (!v || *v == 0 || *v >= (std::uint64_t{1} << 62)) return std::nullopt;
  return v;
}

MachineMemory machine_memory(const std::string& root) {
  MachineMemory m;
  m.bytes = meminfo_total_bytes(read_text(root + "/proc/meminfo"));
  m.source = "MemTotal";
  // The process's cgroup: v2 ("0::/path") and v1's memory controller ("N:memory:/path");
  // in a container the namespace root (/sys/fs/cgroup itself) is usually its own.
  std::vector<std::string> files = {root + "/sys/fs/cgroup/memory.max",
                                    root + "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  std::istringstream cg(read_text(root + "/proc/self/cgroup"));
  for (std::string line; std::getline(cg, line);) {
    const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path == "/" || path.find("..") != std::string::npos) continue;
    if (controllers.empty()) files.push_back(root + "/sys/fs/cgroup" + path + "/memory.max");
    else if (("," + controllers + ",").find(",memory,") != std::string::npos)
      files.push_back(root + "/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
  }
  for (const std::string& f : files) {
    const std::optional<std::uint64_t> limit = cgroup_limit_bytes(read_text(f));
    if (limit && (m.bytes == 0 || *limit < m.bytes)) {
      m.bytes = *limit;
      m.source = "the cgroup memory limit";
    }
  }
  return m;
}

std::uint64_t MachineNeed::total() const {
  const std::uint64_t one = sat_add(device_bytes, host_bytes);
  const auto n = static_cast<std::uint64_t>(std::max(1, local_ranks));
  return one > std::numeric_limits<std::uint64_t>::max() / n ? std::numeric_limits<std::uint64_t>::max() : one * n;
}

void check_fits_machine(const MachineNeed& need, const MachineMemory& machine, std::string_view fix) {
  if (machine.bytes == 0) return;
  const std::uint64_t total = need.total();
  if (total <= machine.bytes) return;
  std::string parts;
  if (need.device_bytes > 0)
    parts = "device budget " + format_bytes(static_cast<double>(need.device_bytes)) +
            " (the cpu device's arena is host memory) + ";
  parts += "host " + format_bytes(static_cast<double>(need.host_bytes));
  if (need.local_ranks > 1) parts += " per rank, x " + std::to_string(need.local_ranks) + " ranks on this machine";
  throw InvalidArgument("the run needs " + format_bytes(static_cast<double>(total)) + " of this machine's memory (" +
                        parts + "), over its " + format_bytes(static_cast<double>(machine.bytes)) + " (" +
                        machine.source + "); fix: " + std::string(fix));
}

}  // namespace peakbound
