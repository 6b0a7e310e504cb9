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
#pragma once

#include <cstdint>

namespace peakbound::cuda {

void rope_tables(void* stream, float* cos, float* sin, std::int64_t t, std::int64_t d, std::int64_t offset,
                 double theta);
void rope_rotate(void* stream, float* x, const float* cos, const float* sin, std::int64_t t, std::int64_t heads,
                 std::int64_t d, float sign);

void embedding_forward(void* stream, float* out, const std::int32_t* ids, const float* table, std::int64_t T,
                       std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(void* stream, float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T,
                        std::int64_t H, std::int64_t row_offset, std::int64_t rows);

void row_gate_forward(void* stream, float* out, const float* x, const float* z, std::int64_t m, std::int64_t n,
                      bool accumulate);
void row_gate_backward(void* stream, float* dx, float* dz, const float* dout, const float* x, const float* z,
                       std::int64_t m, std::int64_t n);

}  // namespace peakbound::cuda
