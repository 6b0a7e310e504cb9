// `peakbound info`: what this binary was built with and what it sees at run time.
#include <cstdio>
#include <string>

#include "peakbound/build_info.h"
#include "peakbound/cli/command.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/ops/gemm.h"

namespace peakbound::cli {

std::string build_description() {
  std::string s = std::string("peakbound ") + PEAKBOUND_VERSION + " (" + PEAKBOUND_BUILD_TYPE +
                  ", " + PEAKBOUND_COMPILER + ")\n";
#ifdef PEAKBOUND_HAVE_MPI
  s += "  mpi:  on\n";
#else
  s += "  mpi:  off (built with PEAKBOUND_WITH_MPI=OFF)\n";
#endif
#ifdef PEAKBOUND_HAVE_CUDA
  s += "  cuda: on (device backend pending)\n";
#else
  s += "  cuda: off (built without the CUDA toolkit)\n";
#endif
  s += "  blas: OpenBLAS, " + ops::blas_core_name() + " kernels, " +
       std::to_string(ops::blas_num_threads()) + " thread(s)";
  return s;
}

namespace {

Command add_info_command(CLI::App& root) {
  Command c;
  c.app = root.add_subcommand("info", "Print the build configuration and the launch this process sees");
  c.run = [] {
    auto world = world_communicator();
    if (world->rank() == 0) {
      std::printf("%s\n", build_description().c_str());
      std::printf("  ranks: %d (communicator: %s)\n", world->size(), world->backend().c_str());
    }
    return 0;
  };
  return c;
}

const bool registered = register_command("", "info", &add_info_command);

}  // namespace

}  // namespace peakbound::cli
