// A per-row sigmoid gate, llm.c style: Qwen2-MoE's shared-expert gate
// (Qwen2MoeSparseMoeBlock: shared = sigmoid(h W_sg^T) * shared_expert(h)), whose
// [T, 1] logit z = h W_sg^T is a GEMM around it. Over m rows of n values:
//   forward:  out[r, :] (+)= sigmoid(z[r]) * x[r, :]
//   backward: dx[r, :] = sigmoid(z[r]) * dout[r, :]                 (WRITTEN)
//             dz[r]    = sigmoid(z[r]) (1 - sigmoid(z[r])) * sum_j dout[r, j] x[r, j]   (WRITTEN)
//
// bf16 (mixed precision): x, out, dout, dx and dz are bf16; z stays fp32. z is the fp32 C
// of the gate's GEMM (gemm_bf16 accumulates into fp32), read as it is rather than rounded.
// dz is an activation gradient and the bf16 operand of the two GEMMs after it (dW_sg +=
// dz^T h and dh += dz W_sg, both gemm_bf16 with bf16 h and W_sg), so it is stored bf16.
// Loads are widened and the math is the f32 form's, rounded once per store: the bf16
// outputs are bitwise to_bf16(the f32 outputs on the widened inputs); forward with
// accumulate reads the bf16 out, adds in fp32 and rounds once.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

// x [m, n], z [m] -> out [m, n]: written, or added into with accumulate. out must not
// alias x unless accumulate is false.
void row_gate_forward(float* out, const float* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate);
void row_gate_forward(bf16* out, const bf16* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate);

// dout [m, n], x [m, n], z [m] -> dx [m, n], dz [m], both written. dx may alias x or
// dout and dz may alias z (each row is read before it is written). In the bf16 form dz
// (bf16) must not overlap z (fp32); dx may still alias x or dout.
void row_gate_backward(float* dx, float* dz, const float* dout, const float* x, const float* z, std::int64_t m,
                       std::int64_t n);
void row_gate_backward(bf16* dx, bf16* dz, const bf16* dout, const bf16* x, const float* z, std::int64_t m,
                       std::int64_t n);

}  // namespace peakbound::cpu
