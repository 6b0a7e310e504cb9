#include "peakbound/device/cpu/cpu_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

TEST(CpuDevice, AllocatesWritableMemoryUnderItsBudget) {
  CpuDevice dev(8 * MiB);
  Buffer b = dev.allocate(Component::params, 4 * MiB);
  std::memset(b.data(), 0xab, b.bytes());  // the region is real memory
  EXPECT_EQ(b.as<unsigned char>()[b.bytes() - 1], 0xab);
  EXPECT_EQ(dev.arena().capacity(), 8 * MiB);
  try {
    dev.allocate(Component::dispatch, 5 * MiB);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("'dispatch'"), std::string::npos) << e.what();
  }
}

TEST(CpuDevice, CopiesRunInSubmissionOrder) {
  CpuDevice dev(4 * MiB);
  HostMemory host;
  const std::uint64_t n = 1 << 16;
  Buffer h = host.allocate(Component::workspace, n * 4);
  Buffer d1 = dev.allocate(Component::layer, n * 4);
  Buffer d2 = dev.allocate(Component::layer, n * 4);
  Buffer back = host.allocate(Component::workspace, n * 4);
  std::iota(h.as<float>(), h.as<float>() + n, 0.0f);
  Stream& s = dev.copy_stream();
  // A chain whose result depends on order: h -> d1 -> d2 -> back, then overwrite d1.
  dev.memcpy_async(d1.data(), h.data(), n * 4, CopyKind::host_to_device, s);
  dev.memcpy_async(d2.data(), d1.data(), n * 4, CopyKind::device_to_device, s);
  dev.memcpy_async(back.data(), d2.data(), n * 4, CopyKind::device_to_host, s);
  std::vector<float> zeros(n, -1.0f);
  dev.memcpy_async(d1.data(), zeros.data(), n * 4, CopyKind::host_to_device, s);
  dev.synchronize(s);
  for (std::uint64_t i = 0; i < n; i += 997) ASSERT_EQ(back.as<float>()[i], static_cast<float>(i));
  EXPECT_EQ(d1.as<float>()[5], -1.0f);
  CopyStats st = dev.copy_stats();
  EXPECT_EQ(st.bytes[static_cast<int>(CopyKind::host_to_device)], 2 * n * 4);
  EXPECT_EQ(st.copies[static_cast<int>(CopyKind::device_to_host)], 1u);
}

TEST(CpuDevice, CopiesAreAsynchronousAndWaitOnEvents) {
  CpuDevice dev(4 * MiB);
  // A gate stream whose first task blocks until the test releases it.
  auto& gate = static_cast<CpuStream&>(dev.create_stream("gate"));
  std::promise<void> release;
  std::shared_future<void> opened = release.get_future().share();
  gate.submit([opened] { opened.wait(); });
  Event gate_done = dev.record(gate);
  EXPECT_FALSE(gate_done.query());

  int src = 42, dst = 0;
  Stream& copy = dev.copy_stream();
  dev.wait(copy, gate_done);  // the copy engine must not pass this point before the gate opens
  dev.memcpy_async(&dst, &src, sizeof src, CopyKind::host_to_device, copy);
  Event copied = dev.record(copy);
  EXPECT_FALSE(copied.query());
  EXPECT_EQ(dst, 0);

  release.set_value();
  copied.synchronize();
  EXPECT_TRUE(copied.query());
  EXPECT_TRUE(gate_done.query());
  EXPECT_EQ(dst, 42);
}

TEST(CpuDevice, ComputeStreamIsInlineAndItsEventsAreComplete) {
  CpuDevice dev(1 * MiB);
  int src = 7, dst = 0;
  dev.memcpy_async(&dst, &src, sizeof src, CopyKind::device_to_device, dev.compute_stream());
  EXPECT_EQ(dst, 7);  // ran on the caller's thread
  EXPECT_TRUE(dev.record(dev.compute_stream()).query());
  EXPECT_TRUE(Event().query());
}

TEST(CpuDevice, SynchronizeRethrowsAFailedTaskOnce) {
  CpuDevice dev(1 * MiB);
  auto& s = static_cast<CpuStream&>(dev.create_stream("failing"));
  s.submit([] { throw InvalidArgument("copy failed on purpose"); });
  Event after = s.record();
  after.synchronize();  // events after a failure still complete: nobody hangs
  EXPECT_THROW(dev.synchronize(s), InvalidArgument);
  EXPECT_NO_THROW(dev.synchronize(s));
}

TEST(CpuDevice, StreamOfAnotherDeviceIsRejected) {
  CpuDevice a(1 * MiB), b(1 * MiB);
  struct Foreign final : Stream {
    std::string n = "foreign";
    const std::string& name() const override { return n; }
  } foreign;
  EXPECT_THROW(a.record(foreign), InvalidArgument);
  EXPECT_NO_THROW(a.record(b.copy_stream()));  // another CpuStream is accepted: same backend
}

TEST(Device, FactoryRejectsUnknownKinds) {
  EXPECT_THROW(make_device("tpu", 1 * MiB), InvalidArgument);
#ifndef PEAKBOUND_HAVE_CUDA
  EXPECT_THROW(make_device("cuda", 1 * MiB), Unavailable);  // a CPU-only build says so
#endif
  EXPECT_EQ(make_device("cpu", 1 * MiB)->arena().capacity(), 1 * MiB);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
