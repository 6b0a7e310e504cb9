#include "peakbound/bench/harness.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "peakbound/build_info.h"
#include "peakbound/kernels/cpu/gemm.h"

namespace peakbound::bench {

nlohmann::json machine_info() {
  return {{"version", PEAKBOUND_VERSION},
          {"build_type", PEAKBOUND_BUILD_TYPE},
          {"blas_core", cpu::blas_core_name()},
          {"blas_threads", cpu::blas_num_threads()},
          {"hardware_threads", std::thread::hardware_concurrency()}};
}

}  // namespace peakbound::bench
