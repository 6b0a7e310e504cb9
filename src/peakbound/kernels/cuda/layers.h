// The CUDA backend's rotary embedding, token embedding and row gate, llm.c style: free
// functions over raw device pointers launched on `stream` (a cudaStream_t). Math,
// shapes and what is written or added into are the CPU kernels' (kernels/cpu/rope.h,
// embedding.h, row_gate.h); the op layer checks shapes before it calls these.
//   rope_tables     cos, sin [T, D/2] WRITTEN (angles in double, as on the CPU)
//   rope_rotate     x [T, heads, D] rotated IN PLACE by sign x angle (+1 forward, -1 backward)
//   embedding_forward   out [T, H] WRITTEN (rows outside the shard are zeros)
//   embedding_backward  ADDS into dtable [rows, H]: one thread per column, tokens in
//                       order, so repeated ids sum in the CPU's order (deterministic)
//   row_gate_forward    out [m, n] WRITTEN or ADDED INTO (accumulate)
//   row_gate_backward   dx [m, n], dz [m] WRITTEN (row dot in double)
// bf16 overloads (mixed precision), tensors as on the CPU: rope's x bf16 with fp32 tables;
// embedding's table and out bf16, its dout bf16 added into an fp32 dtable; the row gate's
// x, out, dout, dx, dz bf16 with an fp32 z. Loads widen, the math is the f32 kernel's and
// each store rounds once with core/dtype.h's to_bf16 in bit operations (nearest even, NaN
// quieted), so a bf16 output is the rounding of the f32 kernel's output on the widened
// inputs: bitwise the CPU's where the f32 kernels agree bitwise (the embedding), within a
// bf16 unit in the last place where nvcc's FMA contraction or expf differ from the CPU.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/model/rope_scaling.h"

namespace peakbound::cuda {

void rope_tables(void* stream, float* cos, float* sin, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta, const RopeScaling& scaling);
void rope_rotate(void* stream, float* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign);
void rope_rotate(void* stream, bf16* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign);

void embedding_forward(void* stream, float* out, const std::int32_t* ids, const float* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_forward(void* stream, bf16* out, const std::int32_t* ids, const bf16* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(void* stream, float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(void* stream, float* dtable, const std::int32_t* ids, const bf16* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows);

void row_gate_forward(void* stream, float* out, const float* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate);
void row_gate_forward(void* stream, bf16* out, const bf16* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate);
void row_gate_backward(void* stream, float* dx, float* dz, const float* dout, const float* x, const float* z,
                       std::int64_t m, std::int64_t n);
void row_gate_backward(void* stream, bf16* dx, bf16* dz, const bf16* dout, const bf16* x, const float* z,
                       std::int64_t m, std::int64_t n);

}  // namespace peakbound::cuda
