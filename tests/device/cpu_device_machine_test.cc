// make_device("cpu", budget): the CPU device's arena is RAM, committed as it fills, so a
// budget over the machine's memory is refused at once (one line naming --device-memory)
// instead of the OOM killer ending the process when the arena fills (issue 25).
#include <gtest/gtest.h>

#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/system_memory.h"
#include "peakbound/device/device.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(CpuDeviceMachine, ABudgetOverTheMachinesMemoryIsRefused) {
  const MachineMemory m = machine_memory();
  if (m.bytes == 0) GTEST_SKIP() << "no /proc/meminfo here";
  try {
    (void)make_device("cpu", m.bytes + (1ull << 30));
    ADD_FAILURE() << "a budget over the machine's memory was accepted";
  } catch (const OutOfBudget& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("over this machine's memory"), std::string::npos) << what;
    EXPECT_NE(what.find("--device-memory"), std::string::npos) << what;
  }
  // Within it: made (nothing is committed until the arena places data).
  EXPECT_NO_THROW((void)make_device("cpu", m.bytes / 2));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
