// The machine's GEMM rate at each precision, measured through the op layer on a device
// of the given kind: square products C[n,n] = A[n,n] B[n,n] (2 n^3 flops each), one
// warm-up and then `repeats` timed runs, reported as the median and the spread. The
// rates the mixed-precision speedup and the model FLOP utilisation are judged against:
//   f32           ops::gemm (OpenBLAS sgemm on the CPU device)
//   bf16          ops::gemm_bf16 on the process's path (ops::bf16_gemm_path())
//   bf16 others   the same on the other CPU paths, measured too where the process's path
//                 is amx (native, convert) or native (convert), so the paths are seen side
//                 by side on one machine
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace peakbound {

struct GemmRate {
  std::string precision;  // "f32", "bf16"
  std::string path;       // "openblas sgemm", "amx", "native", "convert", "cublas"
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

// The small products the trainer makes (tiny-moe: H 256, heads of D 32, experts of F 512,
// vocab 16384 split over P ranks, 128..512-token batches): C[m,n] = op(A) op(B) with
// trans_a / trans_b as the layers call them (weights stored [out, in], so forward is NT,
// dX is NN and dW is TN).
struct GemmShape {
  std::string name;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
};
std::vector<GemmShape> trainer_gemm_shapes();

// Median flop rates of one shape: f32 (ops::gemm) and bf16 on each runnable CPU path
// (amx is 0 where the process does not run amx, native 0 where the CPU lacks AVX512-BF16). Each timed run repeats the product
// until about 5 ms have passed; `repeats` runs per path, the median kept.
struct GemmShapeRate {
  GemmShape shape;
  double f32 = 0, native = 0, convert = 0, amx = 0;
};
std::vector<GemmShapeRate> measure_gemm_shape_rates(std::string_view device_kind, const std::vector<GemmShape>& shapes,
                                                    int repeats);
// [{name, trans_a, trans_b, m, n, k, f32_flops_per_second, native_..., convert_..., amx_...}]
nlohmann::json gemm_shape_rates_json(const std::vector<GemmShapeRate>& rates);

}  // namespace peakbound
