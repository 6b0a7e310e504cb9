#include "peakbound/ops/moe_permute.h"

#include "peakbound/kernels/cpu/moe_permute.h"
#include "peakbound/kernels/cuda/moe_permute.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void moe_gather_rows(Device& dev, Stream& s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  dispatch(dev, s, "moe_gather_rows", {dst, src, rows},
           [&](void* stream) { cuda::moe_gather_rows(stream, dst, src, rows, n, width); },
           [=] { cpu::moe_gather_rows(dst, src, rows, n, width); });
}

void moe_pack_rows(Device& dev, Stream& s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  dispatch(dev, s, "moe_pack_rows", {dst, copies, x, dy, w},
           [&](void* stream) { cuda::moe_pack_rows(stream, dst, width, copies, n, K, H, x, dy, w); },
           [=] { cpu::moe_pack_rows(dst, width, copies, n, K, H, x, dy, w); });
}

void moe_group_rows(Device& dev, Stream& s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  dispatch(dev, s, "moe_group_rows", {xg, dyg, wg, recv, perm},
           [&](void* stream) { cuda::moe_group_rows(stream, xg, dyg, wg, recv, width, perm, n, H); },
           [=] { cpu::moe_group_rows(xg, dyg, wg, recv, width, perm, n, H); });
}

void moe_ungroup_rows(Device& dev, Stream& s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  dispatch(dev, s, "moe_ungroup_rows", {out, outg, dwg, perm},
           [&](void* stream) { cuda::moe_ungroup_rows(stream, out, width, outg, dwg, perm, n, H); },
           [=] { cpu::moe_ungroup_rows(out, width, outg, dwg, perm, n, H); });
}

void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  dispatch(dev, s, "moe_dot_scale_rows", {dw, dy, o, w},
           [&](void* stream) { cuda::moe_dot_scale_rows(stream, dw, dy, o, w, m, H); },
           [=] { cpu::moe_dot_scale_rows(dw, dy, o, w, m, H); });
}

void moe_unpack_rows(Device& dev, Stream& s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw) {
  dispatch(dev, s, "moe_unpack_rows", {src, copies, order, starts, y, w, dx, dw},
           [&](void* stream) {
             cuda::moe_unpack_rows(stream, src, width, copies, order, starts, segments, K, H, y, w, dx, dw);
           },
           [=] { cpu::moe_unpack_rows(src, width, copies, order, starts, segments, K, H, y, w, dx, dw); });
}

}  // namespace peakbound::ops
