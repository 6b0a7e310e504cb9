// CudaDevice on a real GPU: the budget is one allocation the Arena places into, copies
// round-trip in order on a stream, events order one stream after another, host tasks
// run in stream order and their failures come back at synchronize. Without a visible
// GPU every test skips with the runtime's reason (CI compiles these; the GPU check runs them).
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/device/cuda/cuda_device.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

TEST(CudaDevice, TheBudgetIsOneRegionTheArenaPlacesInto) {
  PB_NEED_GPU();
  CudaDevice dev(64 * MiB);
  EXPECT_EQ(dev.backend(), Backend::cuda);
  EXPECT_EQ(dev.arena().capacity(), 64 * MiB);
  Buffer a = dev.allocate(Component::workspace, 40 * MiB);
  EXPECT_THROW(dev.allocate(Component::workspace, 40 * MiB), OutOfBudget);
  a.reset();
  EXPECT_NO_THROW(dev.allocate(Component::workspace, 40 * MiB));
}

TEST(CudaDevice, CopiesRoundTripInStreamOrder) {
  PB_NEED_GPU();
  CudaDevice dev(16 * MiB);
  const std::size_t n = 1 << 20;
  std::vector<float> in(n), out(n, -1.0f);
  std::iota(in.begin(), in.end(), 0.0f);
  Buffer d = dev.allocate(Component::workspace, n * sizeof(float));
  Buffer e = dev.allocate(Component::workspace, n * sizeof(float));
  Stream& s = dev.copy_stream();
  dev.memcpy_async(d.data(), in.data(), n * sizeof(float), CopyKind::host_to_device, s);
  dev.memcpy_async(e.data(), d.data(), n * sizeof(float), CopyKind::device_to_device, s);
  dev.memcpy_async(out.data(), e.data(), n * sizeof(float), CopyKind::device_to_host, s);
  dev.synchronize(s);
  EXPECT_EQ(out, in);
  const CopyStats st = dev.copy_stats();
  EXPECT_EQ(st.bytes[static_cast<int>(CopyKind::host_to_device)], n * sizeof(float));
  EXPECT_EQ(st.copies[static_cast<int>(CopyKind::device_to_host)], 1u);
  EXPECT_GT(st.seconds[static_cast<int>(CopyKind::device_to_host)], 0.0);
}

TEST(CudaDevice, AnEventOrdersOneStreamAfterAnother) {
  PB_NEED_GPU();
  CudaDevice dev(16 * MiB);
  const std::size_t n = 4 << 20;
  std::vector<float> in(n, 3.0f), out(n, 0.0f);
  Buffer d = dev.allocate(Component::workspace, n * sizeof(float));
  Stream& other = dev.create_stream("h2d");
  dev.memcpy_async(d.data(), in.data(), n * sizeof(float), CopyKind::host_to_device, other);
  dev.wait(dev.copy_stream(), dev.record(other));
  dev.memcpy_async(out.data(), d.data(), n * sizeof(float), CopyKind::device_to_host, dev.copy_stream());
  Event done = dev.record(dev.copy_stream());
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_EQ(out, in);
}

TEST(CudaDevice, HostTasksRunInOrderAndTheirFailuresComeBack) {
  PB_NEED_GPU();
  CudaDevice dev(1 * MiB);
  Stream& s = dev.create_stream("comm");
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) dev.host_task(s, [&order, i] { order.push_back(i); });
  dev.synchronize(s);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  dev.host_task(s, [] { throw std::runtime_error("host task failed"); });
  EXPECT_THROW(dev.synchronize(s), std::runtime_error);
  EXPECT_NO_THROW(dev.synchronize(s));  // rethrown once
}

TEST(CudaDevice, AStreamOfAnotherDeviceIsRefused) {
  PB_NEED_GPU();
  CudaDevice a(1 * MiB), b(1 * MiB);
  EXPECT_THROW(a.record(b.copy_stream()), InvalidArgument);
}

TEST(CudaDevice, ABudgetLargerThanTheGpuIsAClearError) {
  PB_NEED_GPU();
  EXPECT_THROW(CudaDevice(std::uint64_t{1} << 50), OutOfBudget);
}

// Without a GPU the factory says why in one line; with one it builds the device.
TEST(CudaDevice, TheFactoryBuildsItOrSaysWhyNot) {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    try {
      make_device("cuda", 1 * MiB);
      FAIL() << "make_device(cuda) succeeded with no GPU";
    } catch (const Unavailable& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(make_device("cuda", 1 * MiB)->backend(), Backend::cuda);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
