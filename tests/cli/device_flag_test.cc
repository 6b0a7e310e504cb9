// --device cpu|cuda, and the commands that run on a device kept GPU-clean: under
// strict device memory (PEAKBOUND_STRICT_DEVICE=1) the CPU device's memory is closed
// to host code outside device work, so a host read or write of device memory on these
// paths (which would fault on a GPU) kills the run here.
#include <gtest/gtest.h>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::expect_one_line_error;
using testing::run_cli;

TEST(DeviceFlag, AnUnknownDeviceIsAOneLineError) {
  for (const char* cmd : {"train", "eval --data x.bin", "bench optimizer", "bench checkpoint", "bench dispatch", "verify dispatch", "bench vocab", "verify vocab", "verify checkpoint", "verify attention", "bench reach"}) {
    SCOPED_TRACE(cmd);
    const auto r = run_cli(std::string(cmd) + " --device tpu");
    expect_one_line_error(r, "--device: 'tpu' is not a device (use cpu or cuda)");
  }
}

TEST(DeviceFlag, CudaWithoutAGpuSaysWhy) {
  const auto r = run_cli("bench optimizer --device cuda --params 64K --steps 1 --warmup 0 --bandwidth-bytes 1MiB");
  if (r.code == 0) GTEST_SKIP() << "this machine has a GPU";
  expect_one_line_error(r, "use --device cpu");
}

std::string strict(const std::string& args) { return "env PEAKBOUND_STRICT_DEVICE=1 " + std::string(PEAKBOUND_CLI_PATH) + " " + args; }

TEST(DeviceFlag, TrainAndBenchesKeepHostCodeOffDeviceMemory) {
  for (const std::string args :
       {"train --steps 1 --seq-len 64",
        "bench checkpoint --layers 2 --tokens 128 --hidden 64 --warmup 0 --reps 1",
        "bench optimizer --params 64K --steps 1 --warmup 0 --bandwidth-bytes 1MiB",
        "bench dispatch --tokens 128 --cap 32 --hidden 32 --ffn 48 --experts 4 --reps 1",
        "verify dispatch --tokens 64 --cap 16 --hidden 16 --ffn 24 --experts 4",
        "bench vocab --tokens 64 --vocab 500 --hidden 32 --chunk 16 --reps 1",
        "verify vocab --tokens 40 --vocab 333 --hidden 16",
        "verify checkpoint --tokens 16 --hidden 8"}) {
    SCOPED_TRACE(args);
    const auto r = run_cli("", 300, strict(args));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err.find("touched device memory"), std::string::npos) << r.err;
  }
}

TEST(DeviceFlag, TrainOnFourRanksKeepsHostCodeOffDeviceMemory) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun on this machine";
  const auto m = run_cli("", 300,
                         "env PEAKBOUND_STRICT_DEVICE=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
                         "OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe -np 4 " +
                             std::string(PEAKBOUND_CLI_PATH) + " train --steps 1 --seq-len 64 --cp 2");
  EXPECT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.err.find("touched device memory"), std::string::npos) << m.err;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
