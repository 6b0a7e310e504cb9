#include "peakbound/kernels/cpu/attention_sinks.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace peakbound::cpu {

void attention_sinks_forward(float* out, float* lse, const float* sinks, std::int64_t T, std::int64_t Hq,
                             std::int64_t Dv) {
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t h = 0; h < Hq; ++h) {
      float& l = lse[i * Hq + h];
      const float s = sinks[h];
      if (std::isinf(l) && l < 0) {  // no visible key: only the sink, which attends to nothing
        l = s;
        continue;
      }
      const float m = std::max(l, s);
      const float merged = m + std::log(std::exp(l - m) + std::exp(s - m));
      const float keep = std::exp(l - merged);
      float* o = out + (i * Hq + h) * Dv;
      for (std::int64_t d = 0; d < Dv; ++d) o[d] *= keep;
      l = merged;
    }
}

void attention_sinks_backward(float* dsinks, const float* lse, const float* row_dot, const float* sinks,
                              std::int64_t T, std::int64_t Hq) {
  std::vector<double> acc(static_cast<std::size_t>(Hq), 0.0);
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t h = 0; h < Hq; ++h)
      acc[static_cast<std::size_t>(h)] -=
          std::exp(static_cast<double>(sinks[h]) - lse[i * Hq + h]) * row_dot[i * Hq + h];
  for (std::int64_t h = 0; h < Hq; ++h) dsinks[h] += static_cast<float>(acc[static_cast<std::size_t>(h)]);
}

}  // namespace peakbound::cpu
