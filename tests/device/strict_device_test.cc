// Strict device memory (PEAKBOUND_STRICT_DEVICE=1, core/device_access.h): the CPU
// device's memory is closed to host code outside device work. Each case runs in a
// child process (gtest's threadsafe death tests re-run the test), which reads the
// variable fresh: device work (ops, copies, host tasks) runs, a direct host access
// dies with the message naming it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/elementwise.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

class StrictDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    setenv("PEAKBOUND_STRICT_DEVICE", "1", 1);
  }
  void TearDown() override { unsetenv("PEAKBOUND_STRICT_DEVICE"); }
};

void device_work_only() {
  CpuDevice dev(4 * MiB);
  Buffer b = dev.allocate(Component::workspace, 1024 * sizeof(float));
  ops::fill(dev, dev.compute_stream(), b.as<float>(), 1024, 2.0f);
  ops::scale(dev, dev.compute_stream(), b.as<float>(), 1024, 1.5f);
  std::vector<float> host(1024, 0.0f);
  copy_to_host(dev, host.data(), b.data(), host.size() * sizeof(float));
  dev.host_task(dev.copy_stream(), [p = b.as<float>()] { p[0] = 7.0f; });  // a host task is device work
  dev.synchronize();
  copy_to_host(dev, host.data(), b.data(), sizeof(float));
  std::exit(host[0] == 7.0f && host[1] == 3.0f ? 0 : 1);
}

void host_writes_device_memory() {
  CpuDevice dev(4 * MiB);
  Buffer b = dev.allocate(Component::workspace, 1024 * sizeof(float));
  b.as<float>()[3] = 1.0f;  // host code touching device memory
  std::exit(0);
}

TEST_F(StrictDevice, DeviceWorkRuns) { EXPECT_EXIT(device_work_only(), ::testing::ExitedWithCode(0), ""); }

TEST_F(StrictDevice, AHostAccessDiesNamingIt) {
  EXPECT_DEATH(host_writes_device_memory(), "host code touched device memory at 0x");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
