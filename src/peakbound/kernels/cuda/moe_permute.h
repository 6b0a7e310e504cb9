// The CUDA backend's MoE dispatch row movement, llm.c style: free functions over raw
// device pointers (the index arrays too) launched on `stream` (a cudaStream_t). Math,
// shapes, the row layout (the fp32 weight in S slots: 1 float, or 2 bf16 high half
// first) and what is written or added into are the CPU kernels' (kernels/cpu/moe_permute.h):
//   moe_gather_rows     dst [n, width] WRITTEN
//   moe_pack_rows       dst [n, width] WRITTEN (up to 2H + S with dy)
//   moe_group_rows      xg [n, H] WRITTEN; with dyg: dyg [n, H], wg [n] (fp32) WRITTEN
//   moe_ungroup_rows    out rows perm[at] WRITTEN (H elements, and the S weight slots with dwg)
//   moe_dot_scale_rows  dw [m] (fp32) WRITTEN (row dot in double), dy [m, H] scaled IN PLACE
//   moe_unpack_rows     y or dx [T, H] ADDED INTO, one block per token segment adding its
//                       rows in order in fp32 with unfused multiply and add and storing
//                       once (so the sums are the CPU's bit for bit, and no atomics);
//                       dw [copies] (fp32) WRITTEN
// Each has an f32 form and a bf16 form (rows bf16, w/wg/dwg/dw fp32); a bf16 store rounds
// to nearest even with NaN kept quiet, core/dtype.h's to_bf16 bit for bit, so both
// backends agree bitwise.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cuda {

void moe_gather_rows(void* stream, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);
void moe_gather_rows(void* stream, bf16* dst, const bf16* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);
void moe_pack_rows(void* stream, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w);
void moe_pack_rows(void* stream, bf16* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const bf16* x, const bf16* dy, const float* w);
void moe_group_rows(void* stream, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_group_rows(void* stream, bf16* xg, bf16* dyg, float* wg, const bf16* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_ungroup_rows(void* stream, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_ungroup_rows(void* stream, bf16* out, std::int64_t width, const bf16* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_dot_scale_rows(void* stream, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H);
void moe_dot_scale_rows(void* stream, float* dw, bf16* dy, const bf16* o, const float* w, std::int64_t m,
                        std::int64_t H);
void moe_unpack_rows(void* stream, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw);
void moe_unpack_rows(void* stream, const bf16* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, bf16* y, const float* w, bf16* dx, float* dw);

}  // namespace peakbound::cuda
