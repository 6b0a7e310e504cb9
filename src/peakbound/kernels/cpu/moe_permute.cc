#include "peakbound/kernels/cpu/moe_permute.h"

#include <cstring>

namespace peakbound::cpu {

namespace {
std::size_t bytes(std::int64_t floats) { return static_cast<std::size_t>(floats) * sizeof(float); }
}  // namespace

void moe_gather_rows(float* dst, const float* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  for (std::int64_t q = 0; q < n; ++q) std::memcpy(dst + q * width, src + rows[q] * width, bytes(width));
}

void moe_pack_rows(float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const float* x, const float* dy, const float* w) {
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t c = copies[q], t = c / K;
    float* row = dst + q * width;
    std::memcpy(row, x + t * H, bytes(H));
    if (dy) {
      std::memcpy(row + H, dy + t * H, bytes(H));
      row[2 * H] = w[c];
    }
  }
}

void moe_group_rows(float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  for (std::int64_t at = 0; at < n; ++at) {
    const float* row = recv + perm[at] * width;
    std::memcpy(xg + at * H, row, bytes(H));
    if (dyg) {
      std::memcpy(dyg + at * H, row + H, bytes(H));
      wg[at] = row[2 * H];
    }
  }
}

void moe_ungroup_rows(float* out, std::int64_t width, const float* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H) {
  for (std::int64_t at = 0; at < n; ++at) {
    float* row = out + perm[at] * width;
    std::memcpy(row, outg + at * H, bytes(H));
    if (dwg) row[H] = dwg[at];
  }
}

void moe_dot_scale_rows(float* dw, float* dy, const float* o, const float* w, std::int64_t m, std::int64_t H) {
  for (std::int64_t q = 0; q < m; ++q) {
    double dot = 0;
    for (std::int64_t k = 0; k < H; ++k) dot += static_cast<double>(dy[q * H + k]) * o[q * H + k];
    dw[q] = static_cast<float>(dot);
    const float wq = w[q];
    for (std::int64_t k = 0; k < H; ++k) dy[q * H + k] *= wq;
  }
}

void moe_unpack_rows(const float* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, float* y,
                     const float* w, float* dx, float* dw) {
  for (std::int64_t sg = 0; sg < segments; ++sg) {
    for (std::int64_t j = starts[sg]; j < starts[sg + 1]; ++j) {
      const std::int64_t q = order[j], c = copies[q], t = c / K;
      const float* row = src + q * width;
      if (dx) {
        float* d = dx + t * H;
        for (std::int64_t k = 0; k < H; ++k) d[k] += row[k];
        dw[c] = row[H];
      } else {
        float* yt = y + t * H;
        const float wc = w[c];
        for (std::int64_t k = 0; k < H; ++k) yt[k] += wc * row[k];
      }
    }
  }
}

}  // namespace peakbound::cpu
