// `peakbound info`: what this binary was built with and what it sees at run time.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/ops/gemm_rate.h"
#include "peakbound/build_info.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/comm/single_copy.h"
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
  s += "  cuda: on (--device cuda)\n";
#else
  s += "  cuda: off (built without the CUDA toolkit)\n";
#endif
  s += "  blas: OpenBLAS, " + ops::blas_core_name() + " kernels (" + ops::blas_core_source() + "), " +
       std::to_string(ops::blas_num_threads()) + " thread(s)";
  return s;
}

namespace {

struct InfoFlags {
  std::int64_t gemm_size = 2048;
  int gemm_repeats = 5;
  std::string device = "cpu";
  bool json = false;
  bool gemm_shapes = false;
  bool single_copy = false;
};

Command add_info_command(CLI::App& root) {
  Command c;
  auto f = std::make_shared<InfoFlags>();
  c.app = root.add_subcommand("info", "Print the build configuration, the launch this process sees and the "
                                      "measured GEMM rate at each precision");
  int_flag(c.app, "--gemm-size", f->gemm_size, "Side of the square GEMM timed at each precision (0: skip)", 0,
           16384);
  int_flag(c.app, "--gemm-repeats", f->gemm_repeats, "Timed runs of each GEMM (the median is printed)", 1, 1000);
  device_flag(c.app, f->device);
  c.app->add_flag("--json", f->json, "Print the same as one JSON object");
  c.app->add_flag("--gemm-shapes", f->gemm_shapes,
                  "Also time the trainer's small products (tiny-moe shapes): f32, bf16 native and convert");
  c.app->add_flag("--mpi-single-copy", f->single_copy,
                  "Print only the value for OMPI_MCA_btl_vader_single_copy_mechanism this machine allows (cma "
                  "where one process may read another's memory, else none) and exit");
  c.run = [f] {
    // Probed before MPI starts (the probe forks).
    const std::string single_copy = mpi_single_copy_mechanism();
    if (f->single_copy) {
      std::printf("%s\n", single_copy.c_str());
      return 0;
    }
    auto world = world_communicator();
    if (world->rank() != 0) return 0;
    std::vector<GemmRate> rates;
    if (f->gemm_size > 0) rates = measure_gemm_rates(f->device, f->gemm_size, f->gemm_repeats);
    std::vector<GemmShapeRate> shapes;
    if (f->gemm_shapes) shapes = measure_gemm_shape_rates(f->device, trainer_gemm_shapes(), f->gemm_repeats);
    if (f->json) {
      nlohmann::json j = {{"version", PEAKBOUND_VERSION}, {"build_type", PEAKBOUND_BUILD_TYPE},
                          {"compiler", PEAKBOUND_COMPILER}, {"blas_core", ops::blas_core_name()},
                          {"blas_core_source", ops::blas_core_source()},
                          {"blas_threads", ops::blas_num_threads()}, {"bf16_gemm_path", ops::bf16_gemm_path()},
                          {"ranks", world->size()}, {"communicator", world->backend()},
                          {"mpi_single_copy", single_copy}};
      if (!rates.empty()) j["gemm"] = gemm_rates_json(rates, f->gemm_size, f->gemm_repeats);
      if (!shapes.empty()) j["gemm_shapes"] = gemm_shape_rates_json(shapes);
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("%s\n", build_description().c_str());
    std::printf("  ranks: %d (communicator: %s)\n", world->size(), world->backend().c_str());
    std::printf("  mpi single copy: %s (%s)\n", single_copy.c_str(),
                single_copy == "cma" ? "process_vm_readv allowed: large messages move in one copy"
                                     : "process_vm_readv refused: large messages move only inside MPI calls");
    const std::string path = ops::bf16_gemm_path();
    std::printf("  bf16 gemm: %s (%s)\n", path.c_str(),
                path == "amx"      ? "AMX tile products"
                : path == "native" ? "AVX512-BF16 dot products"
                                   : "blocks widened to f32 for sgemm");
    if (!rates.empty())
      std::printf("  gemm: %s; %s, %lld^3, median of %d\n", gemm_rates_line(rates).c_str(), f->device.c_str(),
                  static_cast<long long>(f->gemm_size), f->gemm_repeats);
    if (!shapes.empty()) std::printf("  %-28s %5s %5s %5s  %8s %8s %8s %8s GFLOP/s\n", "shape", "m", "n", "k", "f32",
                                     "amx", "native", "convert");
    for (const GemmShapeRate& r : shapes)
      std::printf("  %-28s %5lld %5lld %5lld  %8.1f %8.1f %8.1f %8.1f\n", r.shape.name.c_str(),
                  static_cast<long long>(r.shape.m), static_cast<long long>(r.shape.n),
                  static_cast<long long>(r.shape.k), r.f32 / 1e9, r.amx / 1e9, r.native / 1e9, r.convert / 1e9);
    return 0;
  };
  return c;
}

const bool registered = register_command("", "info", &add_info_command);

}  // namespace

}  // namespace peakbound::cli
