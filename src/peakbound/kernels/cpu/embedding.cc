#include "peakbound/kernels/cpu/embedding.h"

#include <algorithm>

namespace peakbound::cpu {

void embedding_forward(float* out, const std::int32_t* ids, const float* table, std::int64_t T, std::int64_t H,
                       std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    float* o = out + t * H;
    if (r >= 0 && r < rows) std::copy(table + r * H, table + (r + 1) * H, o);
    else std::fill(o, o + H, 0.0f);
  }
}

void embedding_backward(float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T, std::int64_t H,
                        std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    if (r < 0 || r >= rows) continue;
    float* d = dtable + r * H;
    const float* g = dout + t * H;
    for (std::int64_t h = 0; h < H; ++h) d[h] += g[h];
  }
}

}  // namespace peakbound::cpu
