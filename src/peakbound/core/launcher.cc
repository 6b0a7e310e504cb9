#include "peakbound/core/launcher.h"

#include <cstdlib>
#include <initializer_list>

namespace peakbound {

namespace {

// The first variable that holds a whole number in [0, 2^30); `fallback` otherwise.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) {
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && x >= 0 && x < (1L << 30)) return static_cast<int>(x);
    }
  return fallback;
}

}  // namespace

int launcher_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, 0); }
int launcher_size() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1); }
int launcher_local_size() {
  const int n = env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1);
  return n > 0 ? n : 1;
}

int launcher_local_rank() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0);
}

}  // namespace peakbound
