// MoE dispatch row movement through the device's backend (see kernels/cpu/moe_permute.h
// for what each writes and adds). Every array, the index arrays (rows, copies, perm,
// order, starts) included, is memory of the device: MoeDispatch stages its host-built
// indices into Arena buffers (dispatch_buffers) before it calls these.
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void moe_gather_rows(Device& dev, Stream& s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);
void moe_pack_rows(Device& dev, Stream& s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w);
void moe_group_rows(Device& dev, Stream& s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_ungroup_rows(Device& dev, Stream& s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H);
void moe_unpack_rows(Device& dev, Stream& s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw);

}  // namespace peakbound::ops
