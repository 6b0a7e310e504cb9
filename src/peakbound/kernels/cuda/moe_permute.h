// The CUDA backend's MoE dispatch row movement, llm.c style: free functions over raw
// device pointers (the index arrays too) launched on `stream` (a cudaStream_t). Math,
// shapes and what is written or added into are the CPU kernels' (kernels/cpu/moe_permute.h):
//   moe_gather_rows     dst [n, width] WRITTEN
//   moe_pack_rows       dst [n, width] WRITTEN
//   moe_group_rows      xg [n, H] WRITTEN; with dyg: dyg [n, H], wg [n] WRITTEN
//   moe_ungroup_rows    out rows perm[at] WRITTEN (H floats, and element H with dwg)
//   moe_dot_scale_rows  dw [m] WRITTEN (row dot in double), dy [m, H] scaled IN PLACE
//   moe_unpack_rows     y or dx [T, H] ADDED INTO, one block per token segment adding its
//                       rows in order with unfused multiply and add (so the sums are the
//                       CPU's bit for bit, and no atomics); dw [copies] WRITTEN
#pragma once

#include <cstdint>

namespace peakbound::cuda {

void moe_gather_rows(void* stream, float* dst, const float* src, const std::int64_t* rows, std::int64_t n,
                     std::int64_t width);
void moe_pack_rows(void* stream, float* dst, std::int64_t width, const std::int64_t* copies, std::int64_t n,
                   std::int64_t K, std::int64_t H, const float* x, const float* dy, const float* w);
void moe_group_rows(void* stream, float* xg, float* dyg, float* wg, const float* recv, std::int64_t width,
                    const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_ungroup_rows(void* stream, float* out, std::int64_t width, const float* outg, const float* dwg,
                      const std::int64_t* perm, std::int64_t n, std::int64_t H);
void moe_dot_scale_rows(void* stream, float* dw, float* dy, const float* o, const float* w, std::int64_t m,
                        std::int64_t H);
void moe_unpack_rows(void* stream, const float* src, std::int64_t width, const std::int64_t* copies,
                     const std::int64_t* order, const std::int64_t* starts, std::int64_t segments, std::int64_t K,
                     std::int64_t H, float* y, const float* w, float* dx, float* dw);

}  // namespace peakbound::cuda
