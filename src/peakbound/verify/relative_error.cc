#include "peakbound/verify/relative_error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace peakbound::verify {

double group_relative_error(Communicator& g, const float* a, const float* ref, std::int64_t n) {
  // [max|a - ref|, max|ref|, NaN seen]: MPI's max over doubles need not propagate NaN,
  // so NaN travels as a flag.
  double v[3] = {0, 0, 0};
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(ref[i]));
    const double r = std::fabs(static_cast<double>(ref[i]));
    if (std::isnan(d) || std::isnan(r)) {
      v[2] = 1;
      continue;
    }
    v[0] = std::max(v[0], d);
    v[1] = std::max(v[1], r);
  }
  g.all_reduce(v, 3, DType::f64, ReduceOp::max);
  if (v[2] != 0) return std::numeric_limits<double>::quiet_NaN();
  return v[1] > 0 ? v[0] / v[1] : v[0];
}

}  // namespace peakbound::verify
