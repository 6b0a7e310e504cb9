#include "peakbound/ops/moe_permute.h"

#include <string>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/moe_permute.h"
#include "peakbound/kernels/cuda/moe_permute.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

std::int64_t moe_weight_slots(DType rows) {
  if (rows == DType::f32) return 1;
  if (rows == DType::bf16) return 2;
  throw InvalidArgument("moe dispatch rows must be f32 or bf16, not " + std::string(dtype_name(rows)));
}

std::int64_t moe_send_width(std::int64_t H, bool backward, DType rows) {
  return backward ? 2 * H + moe_weight_slots(rows) : H;
}

std::int64_t moe_result_width(std::int64_t H, bool backward, DType rows) {
  return backward ? H + moe_weight_slots(rows) : H;
}

namespace {

// Refuses a row narrower than its layout (a bf16 row sized as an f32 one would lose the
// weight's low half), before either backend runs.
template <typename T>
void check_width(const char* op, std::int64_t width, std::int64_t need) {
  if (width < need)
    throw InvalidArgument(std::string(op) + ": " + std::string(dtype_name(dtype_of<T>())) + " rows of width " +
                          std::to_string(width) + " need at least " + std::to_string(need));
}

template <typename T>
void gather_rows(Device& dev, Stream& s, T* dst, const T* src, const std::int64_t* rows, std::int64_t n,
                 std::int64_t width) {
  dispatch(dev, s, "moe_gather_rows", {dst, src, rows},
           [&](void* stream) { cuda::moe_gather_rows(stream, dst, src, rows, n, width); },
           [=] { cpu::moe_gather_rows(dst, src, rows, n, width); });
}

template <typename T>
void pack_rows(Device& dev, Stream& s, T* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
               std::int64_t K, std::int64_t H, const T* x, const T* dy, const float* w) {
  dispatch(dev, s, "moe_pack_rows", {dst, copies, x, dy, w},
           [&] { check_width<T>("moe_pack_rows", width, moe_send_width(H, dy != nullptr, dtype_of<T>())); },
           [&](void* stream) { cuda::moe_pack_rows(stream, dst, width, copies, n, K, H, x, dy, w); },
           [=] { cpu::moe_pack_rows(dst, width, copies, n, K, H, x, dy, w); });
}

template <typename T>
void group_rows(Device& dev, Stream& s, T* xg, T* dyg, float* wg, const T* recv, std::int64_t width,
                const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  dispatch(dev, s, "moe_group_rows", {xg, dyg, wg, recv, perm},
           [&] { check_width<T>("moe_group_rows", width, moe_send_width(H, dyg != nullptr, dtype_of<T>())); },
           [&](void* stream) { cuda::moe_group_rows(stream, xg, dyg, wg, recv, width, perm, n, H); },
           [=] { cpu::moe_group_rows(xg, dyg, wg, recv, width, perm, n, H); });
}

template <typename T>
void ungroup_rows(Device& dev, Stream& s, T* out, std::int64_t width, const T* outg, const float* dwg,
                  const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  dispatch(dev, s, "moe_ungroup_rows", {out, outg, dwg, perm},
           [&] { check_width<T>("moe_ungroup_rows", width, moe_result_width(H, dwg != nullptr, dtype_of<T>())); },
           [&](void* stream) { cuda::moe_ungroup_rows(stream, out, width, outg, dwg, perm, n, H); },
           [=] { cpu::moe_ungroup_rows(out, width, outg, dwg, perm, n, H); });
}

template <typename T>
void dot_scale_rows(Device& dev, Stream& s, float* dw, T* dy, const T* o, const float* w, std::int64_t m,
                    std::int64_t H) {
  dispatch(dev, s, "moe_dot_scale_rows", {dw, dy, o, w},
           [&](void* stream) { cuda::moe_dot_scale_rows(stream, dw, dy, o, w, m, H); },
           [=] { cpu::moe_dot_scale_rows(dw, dy, o, w, m, H); });
}

template <typename T>
void unpack_rows(Device& dev, Stream& s, const T* src, std::int64_t width, const std::int64_t* copies,
                 const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                 std::int64_t H, T* y, const float* w, T* dx, float* dw) {
  dispatch(dev, s, "moe_unpack_rows", {src, copies, order, starts, y, w, dx, dw},
           [&] {
             if (segments == 0) return;  // a rank without rows may pass neither output
             if ((y == nullptr) == (dx == nullptr)) throw InvalidArgument("moe_unpack_rows: give exactly one of y, dx");
             check_width<T>("moe_unpack_rows", width, moe_result_width(H, dx != nullptr, dtype_of<T>()));
           },
           [&](void* stream) {
             cuda::moe_unpack_rows(stream, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
           },
           [=] { cpu::moe_unpack_rows(src, width, copies, order, starts, segments, K, H, y, w, dx, dw); });
}

}  // namespace

void moe_gather_rows(Device& dev, Stream& s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  gather_rows(dev, s, dst, src, rows, n, width);
}
void moe_gather_rows(Device& dev, Stream& s, bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  gather_rows(dev, s, dst, src, rows, n, width);
}

void moe_pack_rows(Device& dev, Stream& s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  pack_rows(dev, s, dst, width, copies, n, K, H, x, dy, w);
}
void moe_pack_rows(Device& dev, Stream& s, bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const bf16* x, const bf16* dy, const float* w) {
  pack_rows(dev, s, dst, width, copies, n, K, H, x, dy, w);
}

void moe_group_rows(Device& dev, Stream& s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  group_rows(dev, s, xg, dyg, wg, recv, width, perm, n, H);
}
void moe_group_rows(Device& dev, Stream& s, bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  group_rows(dev, s, xg, dyg, wg, recv, width, perm, n, H);
}

void moe_ungroup_rows(Device& dev, Stream& s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  ungroup_rows(dev, s, out, width, outg, dwg, perm, n, H);
}
void moe_ungroup_rows(Device& dev, Stream& s, bf16* out, std::int64_t width, const bf16* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  ungroup_rows(dev, s, out, width, outg, dwg, perm, n, H);
}

void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  dot_scale_rows(dev, s, dw, dy, o, w, m, H);
}
void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  dot_scale_rows(dev, s, dw, dy, o, w, m, H);
}

void moe_unpack_rows(Device& dev, Stream& s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw) {
  unpack_rows(dev, s, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}
void moe_unpack_rows(Device& dev, Stream& s, const bf16* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, bf16* y, const float* w, bf16* dx, float* dw) {
  unpack_rows(dev, s, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
}

}  // namespace peakbound::ops
