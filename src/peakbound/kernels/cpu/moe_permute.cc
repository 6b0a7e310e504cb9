#include "peakbound/kernels/cpu/moe_permute.h"

#include <cstring>
#include <vector>

namespace peakbound::cpu {

namespace {

template <typename T>
void copy_row(T* dst, const T* src, std::int64_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}

// The routing weight in a row's weight slots (moe_permute.h): one float, or its fp32
// bits over two bf16 elements, high half first. Exact both ways.
void put_weight(float* slots, float w) { slots[0] = w; }
void put_weight(bf16* slots, float w) {
  const std::uint32_t u = float_bits(w);
  slots[0].bits = static_cast<std::uint16_t>(u >> 16);
  slots[1].bits = static_cast<std::uint16_t>(u & 0xffffu);
}
float get_weight(const float* slots) { return slots[0]; }
float get_weight(const bf16* slots) {
  return bits_float(static_cast<std::uint32_t>(slots[0].bits) << 16 | slots[1].bits);
}

template <typename T>
void gather_rows(T* dst, const T* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  for (std::int64_t q = 0; q < n; ++q) copy_row(dst + q * width, src + rows[q] * width, width);
}

template <typename T>
void pack_rows(T* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K, std::int64_t H,
               const T* x, const T* dy, const float* w) {
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t c = copies[q], t = c / K;
    T* row = dst + q * width;
    copy_row(row, x + t * H, H);
    if (dy) {
      copy_row(row + H, dy + t * H, H);
      put_weight(row + 2 * H, w[c]);
    }
  }
}

template <typename T>
void group_rows(T* xg, T* dyg, float* wg, const T* recv, std::int64_t width, const std::int64_t* perm, std::int64_t n,
                std::int64_t H) {
  for (std::int64_t at = 0; at < n; ++at) {
    const T* row = recv + perm[at] * width;
    copy_row(xg + at * H, row, H);
    if (dyg) {
      copy_row(dyg + at * H, row + H, H);
      wg[at] = get_weight(row + 2 * H);
    }
  }
}

template <typename T>
void ungroup_rows(T* out, std::int64_t width, const T* outg, const float* dwg, const std::int64_t* perm,
                  std::int64_t n, std::int64_t H) {
  for (std::int64_t at = 0; at < n; ++at) {
    T* row = out + perm[at] * width;
    copy_row(row, outg + at * H, H);
    if (dwg) put_weight(row + H, dwg[at]);
  }
}

template <typename T>
void dot_scale_rows(float* dw, T* dy, const T* o, const float* w, std::int64_t m, std::int64_t H) {
  for (std::int64_t q = 0; q < m; ++q) {
    double dot = 0;
    for (std::int64_t k = 0; k < H; ++k) dot += static_cast<double>(widen(dy[q * H + k])) * widen(o[q * H + k]);
    dw[q] = static_cast<float>(dot);
    const float wq = w[q];
    for (std::int64_t k = 0; k < H; ++k) dy[q * H + k] = narrow<T>(widen(dy[q * H + k]) * wq);
  }
}

// Each token's row is summed in fp32 (acc) from its value through its segment's rows in
// order, then stored once: for f32 the same additions in the same order as adding into
// the row directly.
template <typename T>
void unpack_rows(const T* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                 const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, T* y,
                 const float* w, T* dx, float* dw) {
  std::vector<float> acc(static_cast<std::size_t>(H));
  for (std::int64_t sg = 0; sg < segments; ++sg) {
    const std::int64_t a = starts[sg], b = starts[sg + 1];
    if (a == b) continue;
    T* out = (dx ? dx : y) + copies[order[a]] / K * H;
    for (std::int64_t k = 0; k < H; ++k) acc[static_cast<std::size_t>(k)] = widen(out[k]);
    for (std::int64_t j = a; j < b; ++j) {
      const std::int64_t q = order[j], c = copies[q];
      const T* row = src + q * width;
      if (dx) {
        for (std::int64_t k = 0; k < H; ++k) acc[static_cast<std::size_t>(k)] += widen(row[k]);
        dw[c] = get_weight(row + H);
      } else {
        const float wc = w[c];
        for (std::int64_t k = 0; k < H; ++k) acc[static_cast<std::size_t>(k)] += wc * widen(row[k]);
      }
    }
    for (std::int64_t k = 0; k < H; ++k) out[k] = narrow<T>(acc[static_cast<std::size_t>(k)]);
  }
}

}  // namespace

void moe_gather_rows(float* dst, const float* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  gather_rows(dst, src, rows, n, width);
}
void moe_gather_rows(bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n, std::int64_t width) {
  gather_rows(dst, src, rows, n, width);
}

void moe_pack_rows(float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const float* x, const float* dy, const float* w) {
  pack_rows(dst, width, copies, n, K, H, x, dy, w);
}
void moe_pack_rows(bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n, std::int64_t K,
                   std::int64_t H, const bf16* x, const bf16* dy, const float* w) {
  pack_rows(dst, width, copies, n, K, H, x, dy, w);
}

void moe_group_rows(float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  group_rows(xg, dyg, wg, recv, width, perm, n, H);
}
void moe_group_rows(bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width, const std::int64_t* perm,
                    std::int64_t n, std::int64_t H) {
  group_rows(xg, dyg, wg, recv, width, perm, n, H);
}

void moe_ungroup_rows(float* out, std::int64_t width, const float* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H) {
  ungroup_rows(out, width, outg, dwg, perm, n, H);
}
void moe_ungroup_rows(bf16* out, std::int64_t width, const bf16* outg, const float* dwg, const std::int64_t* perm,
                      std::int64_t n, std::int64_t H) {
  ungroup_rows(out, width, outg, dwg, perm, n, H);
}

void moe_dot_scale_rows(float* dw, float* dy, const float* o, const float* w, std::int64_t m, std::int64_t H) {
  dot_scale_rows(dw, dy, o, w, m, H);
}
void moe_dot_scale_rows(float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m, std::int64_t H) {
  dot_scale_rows(dw, dy, o, w, m, H);
}

void moe_unpack_rows(const float* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, float* y,
                     const float* w, float* dx, float* dw) {
  unpack_rows(src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}
void moe_unpack_rows(const bf16* src, std::int64_t width, const std::int64_t* copies, const std::int64_t* order,
                     const std::int64_t* starts, std::int64_t segments, std::int64_t K, std::int64_t H, bf16* y,
                     const float* w, bf16* dx, float* dw) {
  unpack_rows(src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}

}  // namespace peakbound::cpu
