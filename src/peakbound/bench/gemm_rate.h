// The machine's GEMM rate at each precision, measured through the op layer on a device
// of the given kind: square products C[n,n] = A[n,n] B[n,n] (2 n^3 flops each), one
// warm-up and then `repeats` timed runs, reported as the median and the spread. The
// rates the mixed-precision speedup and the model FLOP utilisation are judged against:
//   f32           ops::gemm (OpenBLAS sgemm on the CPU device)
//   bf16          ops::gemm_bf16 on the process's path (ops::bf16_gemm_path())
//   bf16 convert  the same with the convert path, measured too where the process's path
//                 is native, so both CPU paths are seen side by side on one machine
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace peakbound {

struct GemmRate {
  std::string precision;  // "f32", "bf16"
  std::string path;       // "openblas sgemm", "native", "convert", "cublas"
  double flops_per_second = 0;  // the median run
  double min_flops_per_second = 0, max_flops_per_second = 0;
};

// Throws what the device and the ops throw (OutOfBudget, Unavailable).
std::vector<GemmRate> measure_gemm_rates(std::string_view device_kind, std::int64_t size, int repeats);

// {"size", "repeats", "f32_flops_per_second", "bf16_flops_per_second", "bf16_path",
//  "gemm_peak_flops_per_second" (the best median), "rates": [{precision, path,
//  flops_per_second, min_..., max_...}]}
nlohmann::json gemm_rates_json(const std::vector<GemmRate>& rates, std::int64_t size, int repeats);
// One line: "f32 123.4 GFLOP/s (openblas sgemm); bf16 234.5 GFLOP/s (native), 110.2 (convert)".
std::string gemm_rates_line(const std::vector<GemmRate>& rates);

}  // namespace peakbound
