#include "peakbound/schedules/optimizer_clip.h"

#include <cmath>
#include <vector>

namespace peakbound {

double global_sum_squares(Communicator& comm, double local_sum_squares) {
  if (comm.size() == 1) return local_sum_squares;
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&local_sum_squares, all.data(), 1, DType::f64);
  double total = 0;
  for (double x : all) total += x;
  return total;
}

GradClip clip_factor(double global_sum_squares, float max_norm) {
  GradClip c;
  c.norm = std::sqrt(global_sum_squares);
  if (max_norm > 0.0f) c.scale = static_cast<float>(std::min(1.0, static_cast<double>(max_norm) / (c.norm + 1e-6)));
  return c;
}

}  // namespace peakbound
