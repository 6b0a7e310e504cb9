// MoE dispatch row movement through the device's backend (see kernels/cpu/moe_permute.h
// for what each writes and adds, and the row layout). Every array, the index arrays
// (rows, copies, perm, order, starts) included, is memory of the device: MoeDispatch
// stages its host-built indices into Arena buffers (dispatch_buffers) before it calls these.
//
// Each op has an f32 form and a bf16 form (the mixed-precision convention, docs/design.md):
// in the bf16 form the rows (x, dy, the send/receive/result rows, xg, dyg, outg, y, dx
// and the gathered expert parameters) are bf16 and the routing weights and their
// gradients (w, wg, dwg, dw) stay fp32; the weight travels exactly in a row's weight
// slots. A caller sizes rows in elements of the row's dtype with the helpers below: a
// backward send row is 2H + 1 floats (8H + 4 bytes) or 2H + 2 bf16 (4H + 4 bytes: the
// weight's fp32 bits over two bf16), and exchange counts are in elements of that dtype.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

// Elements the fp32 routing weight takes at a row's end: 1 for f32 rows, 2 for bf16.
// Throws InvalidArgument for another dtype.
std::int64_t moe_weight_slots(DType rows);
// A send row's width: H forward ([x]), 2H + slots backward ([x | dy | w]).
std::int64_t moe_send_width(std::int64_t H, bool backward, DType rows);
// A result row's width: H forward ([out]), H + slots backward ([dx | dw]).
std::int64_t moe_result_width(std::int64_t H, bool backward, DType rows);

void moe_gather_rows(Device& dev, Stream& s, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);
void moe_gather_rows(Device& dev, Stream& s, bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);

// The send rows: width >= moe_send_width(H, dy != nullptr, rows' dtype), else InvalidArgument.
void moe_pack_rows(Device& dev, Stream& s, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w);
void moe_pack_rows(Device& dev, Stream& s, bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const bf16* x, const bf16* dy, const float* w);

// recv rows of width >= moe_send_width(H, dyg != nullptr, dtype).
void moe_group_rows(Device& dev, Stream& s, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_group_rows(Device& dev, Stream& s, bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);

// out rows of width >= moe_result_width(H, dwg != nullptr, dtype).
void moe_ungroup_rows(Device& dev, Stream& s, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_ungroup_rows(Device& dev, Stream& s, bf16* out, std::int64_t width, const bf16* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);

void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H);
void moe_dot_scale_rows(Device& dev, Stream& s, float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m,
                        std::int64_t H);

// src rows of width >= moe_result_width(H, dx != nullptr, dtype); exactly one of y, dx.
void moe_unpack_rows(Device& dev, Stream& s, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw);
void moe_unpack_rows(Device& dev, Stream& s, const bf16* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, bf16* y, const float* w, bf16* dx, float* dw);

}  // namespace peakbound::ops
