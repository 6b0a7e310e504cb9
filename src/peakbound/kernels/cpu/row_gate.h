// A per-row sigmoid gate, llm.c style: Qwen2-MoE's shared-expert gate
// (Qwen2MoeSparseMoeBlock: shared = sigmoid(h W_sg^T) * shared_expert(h)), whose
// [T, 1] logit z = h W_sg^T is a GEMM around it. Over m rows of n values:
//   forward:  out[r, :] (+)= sigmoid(z[r]) * x[r, :]
//   backward: dx[r, :] = sigmoid(z[r]) * dout[r, :]                 (WRITTEN)
//             dz[r]    = sigmoid(z[r]) (1 - sigmoid(z[r])) * sum_j dout[r, j] x[r, j]   (WRITTEN)
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// x [m, n], z [m] -> out [m, n]: written, or added into with accumulate. out must not
// alias x unless accumulate is false.
void row_gate_forward(float* out, const float* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate);

// dout [m, n], x [m, n], z [m] -> dx [m, n], dz [m], both written. dx may alias x or
// dout and dz may alias z (each row is read before it is written).
void row_gate_backward(float* dx, float* dz, const float* dout, const float* x, const float* z, std::int64_t m,
                       std::int64_t n);

}  // namespace peakbound::cpu
