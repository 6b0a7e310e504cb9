// The launcher's environment, read before MPI starts: rank, size and local size, with
// defaults when absent and when malformed.
#include <gtest/gtest.h>

#include <cstdlib>

#include "peakbound/core/launcher.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Launcher, ReadsOpenMpisVariablesAndFallsBack) {
  const char* vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK",
                        "PMI_RANK", "SLURM_PROCID", "PMI_SIZE", "SLURM_NTASKS", "MPI_LOCALNRANKS"};
  for (const char* v : vars) ::unsetenv(v);  // the test binary may itself run under mpirun
  EXPECT_EQ(launcher_rank(), 0);
  EXPECT_EQ(launcher_size(), 1);
  EXPECT_EQ(launcher_local_size(), 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(launcher_rank(), 3);
  EXPECT_EQ(launcher_size(), 4);
  EXPECT_EQ(launcher_local_size(), 2);
  ::setenv("OMPI_COMM_WORLD_RANK", "3x", 1);  // malformed: the default
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "0", 1);
  EXPECT_EQ(launcher_rank(), 0);
  EXPECT_EQ(launcher_local_size(), 1);
  for (const char* v : vars) ::unsetenv(v);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
