// The machine's memory (MemTotal, lowered to a cgroup limit) and the check a run's plan
// must pass against it: device budget (when the arena is host memory) plus host memory,
// times the ranks sharing the machine.
#include "peakbound/core/system_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;

TEST(SystemMemory, ParsesMemTotal) {
  EXPECT_EQ(meminfo_total_bytes("MemTotal:       24681512 kB\nMemFree:        22000000 kB\n"), 24681512ull * 1024);
  EXPECT_EQ(meminfo_total_bytes("MemFree: 1 kB\nMemTotal: 2 kB"), 2048u);
  EXPECT_EQ(meminfo_total_bytes(""), 0u);
  EXPECT_EQ(meminfo_total_bytes("MemTotal: lots\n"), 0u);
  EXPECT_EQ(meminfo_total_bytes("MemTotal: 99999999999999999999999 kB\n"), 0u);
}

TEST(SystemMemory, ParsesCgroupLimits) {
  EXPECT_EQ(cgroup_limit_bytes("1073741824\n"), std::optional<std::uint64_t>(1ull << 30));
  EXPECT_FALSE(cgroup_limit_bytes("max\n"));
  EXPECT_FALSE(cgroup_limit_bytes(""));
  EXPECT_FALSE(cgroup_limit_bytes("9223372036854771712\n"));  // cgroup v1's "no limit"
  EXPECT_FALSE(cgroup_limit_bytes("0\n"));
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(SystemMemory, TheCgroupLimitLowersMemTotal) {
  const fs::path root = fs::path(::testing::TempDir()) / ("pb_sysmem_" + std::to_string(::getpid()));
  fs::remove_all(root);
  write(root / "proc/meminfo", "MemTotal: 8388608 kB\n");  // 8 GiB
  MachineMemory m = machine_memory(root.string());
  EXPECT_EQ(m.bytes, 8ull << 30);
  EXPECT_EQ(m.source, "MemTotal");
  write(root / "sys/fs/cgroup/memory.max", "max\n");
  EXPECT_EQ(machine_memory(root.string()).bytes, 8ull << 30);
  // cgroup v2, the process's own group.
  write(root / "proc/self/cgroup", "0::/job/7\n");
  write(root / "sys/fs/cgroup/job/7/memory.max", "2147483648\n");
  m = machine_memory(root.string());
  EXPECT_EQ(m.bytes, 2ull << 30);
  EXPECT_EQ(m.source, "the cgroup memory limit");
  // cgroup v1's memory controller, lower still.
  write(root / "proc/self/cgroup", "4:memory:/box\n0::/job/7\n");
  write(root / "sys/fs/cgroup/memory/box/memory.limit_in_bytes", "1073741824\n");
  EXPECT_EQ(machine_memory(root.string()).bytes, 1ull << 30);
  fs::remove_all(root);
  // No /proc/meminfo at all: unknown, nothing is refused.
  EXPECT_EQ(machine_memory(root.string()).bytes, 0u);
}

TEST(SystemMemory, ThePlanMustFitTheMachine) {
  const MachineMemory m{16ull << 30, "MemTotal"};
  MachineNeed need{8ull << 30, 1ull << 30, 1};
  EXPECT_NO_THROW(check_fits_machine(need, m, "shorten --seq-len"));
  need.local_ranks = 2;  // two ranks on this machine: 18 GiB
  try {
    check_fits_machine(need, m, "shorten --seq-len");
    ADD_FAILURE() << "18 GiB on a 16 GiB machine was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs 18.00 GiB"), std::string::npos) << what;
    EXPECT_NE(what.find("device budget 8.00 GiB"), std::string::npos) << what;
    EXPECT_NE(what.find("host 1.00 GiB per rank, x 2 ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("its 16.00 GiB (MemTotal)"), std::string::npos) << what;
    EXPECT_NE(what.find("fix: shorten --seq-len"), std::string::npos) << what;
  }
  // A GPU's arena is not host memory: only the host side counts.
  EXPECT_NO_THROW(check_fits_machine({0, 6ull << 30, 2}, m, "x"));
  EXPECT_THROW(check_fits_machine({0, 9ull << 30, 2}, m, "x"), InvalidArgument);
  // Saturating, never wrapping to a small number.
  EXPECT_THROW(check_fits_machine({~0ull, ~0ull, 1 << 20}, m, "x"), InvalidArgument);
  // An unknown machine refuses nothing.
  EXPECT_NO_THROW(check_fits_machine({~0ull, 0, 1}, MachineMemory{}, "x"));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
