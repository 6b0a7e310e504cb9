#include "peakbound/bench/harness.h"

#include <fstream>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "peakbound/build_info.h"
#include "peakbound/core/launcher.h"
#include "peakbound/core/error.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/verify/relative_error.h"

namespace peakbound::bench {

nlohmann::json machine_info() {
  return {{"version", PEAKBOUND_VERSION},
          {"build_type", PEAKBOUND_BUILD_TYPE},
          {"blas_core", ops::blas_core_name()},
          {"blas_threads", ops::blas_num_threads()},
          {"hardware_threads", std::thread::hardware_concurrency()}};
}


std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return f ? a + " " + b + " " + c : "unknown";
}

void share_cores_among_local_ranks() { ops::share_host_cores_among_local_ranks(); }

double group_relative_error(Communicator& g, const std::vector<float>& a, const std::vector<float>& ref) {
  PB_CHECK_MSG(a.size() == ref.size(), "group_relative_error: result and reference differ in size");
  return verify::group_relative_error(g, a.data(), ref.data(), static_cast<std::int64_t>(a.size()));
}

}  // namespace peakbound::bench
