#include "peakbound/ops/moe_permute.h"

#include "peakbound/kernels/cpu/launch.h"
#include "peakbound/kernels/cpu/moe_permute.h"
#include "peakbound/kernels/cuda/moe_permute.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

void moe_gather_rows(Device& dev, Stream& s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width) {
  check_device_pointers(dev, "moe_gather_rows", {dst, src, rows});
  PB_ON_CUDA(dev, s, cuda::moe_gather_rows(stream, dst, src, rows, n, width))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_gather_rows");
  cpu::launch(s, [=] { cpu::moe_gather_rows(dst, src, rows, n, width); });
}

void moe_pack_rows(Device& dev, Stream& s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w) {
  check_device_pointers(dev, "moe_pack_rows", {dst, copies, x, dy, w});
  PB_ON_CUDA(dev, s, cuda::moe_pack_rows(stream, dst, width, copies, n, K, H, x, dy, w))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_pack_rows");
  cpu::launch(s, [=] { cpu::moe_pack_rows(dst, width, copies, n, K, H, x, dy, w); });
}

void moe_group_rows(Device& dev, Stream& s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  check_device_pointers(dev, "moe_group_rows", {xg, dyg, wg, recv, perm});
  PB_ON_CUDA(dev, s, cuda::moe_group_rows(stream, xg, dyg, wg, recv, width, perm, n, H))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_group_rows");
  cpu::launch(s, [=] { cpu::moe_group_rows(xg, dyg, wg, recv, width, perm, n, H); });
}

void moe_ungroup_rows(Device& dev, Stream& s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H) {
  check_device_pointers(dev, "moe_ungroup_rows", {out, outg, dwg, perm});
  PB_ON_CUDA(dev, s, cuda::moe_ungroup_rows(stream, out, width, outg, dwg, perm, n, H))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_ungroup_rows");
  cpu::launch(s, [=] { cpu::moe_ungroup_rows(out, width, outg, dwg, perm, n, H); });
}

void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H) {
  check_device_pointers(dev, "moe_dot_scale_rows", {dw, dy, o, w});
  PB_ON_CUDA(dev, s, cuda::moe_dot_scale_rows(stream, dw, dy, o, w, m, H))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_dot_scale_rows");
  cpu::launch(s, [=] { cpu::moe_dot_scale_rows(dw, dy, o, w, m, H); });
}

void moe_unpack_rows(Device& dev, Stream& s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw) {
  check_device_pointers(dev, "moe_unpack_rows", {src, copies, order, starts, y, w, dx, dw});
  PB_ON_CUDA(dev, s, cuda::moe_unpack_rows(stream, src, width, copies, order, starts, segments, K, H, y, w, dx, dw))
  if (dev.backend() != Backend::cpu) no_kernel(dev, "moe_unpack_rows");
  cpu::launch(s, [=] { cpu::moe_unpack_rows(src, width, copies, order, starts, segments, K, H, y, w, dx, dw); });
}

}  // namespace peakbound::ops
