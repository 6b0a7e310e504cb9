#include "peakbound/kernels/cpu/embedding.h"

#include <algorithm>

namespace peakbound::cpu {

namespace {

// S: the storage of table and out (float or bf16). A row is copied as it is (a widen
// then narrow would be the identity on every bf16 but a signalling NaN).
template <typename S>
void forward(S* out, const std::int32_t* ids, const S* table, std::int64_t T, std::int64_t H, std::int64_t row_offset,
             std::int64_t rows) {
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    S* o = out + t * H;
    if (r >= 0 && r < rows) std::copy(table + r * H, table + (r + 1) * H, o);
    else std::fill(o, o + H, narrow<S>(0.0f));
  }
}

// G: the storage of dout (float or bf16), widened as it is loaded; dtable is fp32.
template <typename G>
void backward(float* dtable, const std::int32_t* ids, const G* dout, std::int64_t T, std::int64_t H,
              std::int64_t row_offset, std::int64_t rows) {
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t r = static_cast<std::int64_t>(ids[t]) - row_offset;
    if (r < 0 || r >= rows) continue;
    float* d = dtable + r * H;
    const G* g = dout + t * H;
    for (std::int64_t h = 0; h < H; ++h) d[h] += widen(g[h]);
  }
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* ids, const float* table, std::int64_t T, std::int64_t H,
                       std::int64_t row_offset, std::int64_t rows) {
  forward(out, ids, table, T, H, row_offset, rows);
}

void embedding_forward(bf16* out, const std::int32_t* ids, const bf16* table, std::int64_t T, std::int64_t H,
                       std::int64_t row_offset, std::int64_t rows) {
  forward(out, ids, table, T, H, row_offset, rows);
}

void embedding_backward(float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T, std::int64_t H,
                        std::int64_t row_offset, std::int64_t rows) {
  backward(dtable, ids, dout, T, H, row_offset, rows);
}

void embedding_backward(float* dtable, const std::int32_t* ids, const bf16* dout, std::int64_t T, std::int64_t H,
                        std::int64_t row_offset, std::int64_t rows) {
  backward(dtable, ids, dout, T, H, row_offset, rows);
}

}  // namespace peakbound::cpu
