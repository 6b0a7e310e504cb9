// RMSNorm over the last dimension, llm.c style: free functions over raw row-major
// pointers. out[n, c] = x[n, c] * rstd[n] * weight[c], rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps).
// Used by the residual test block now and by the transformer blocks later.
#pragma once

#include <cstdint>

namespace peakbound::cpu {

// x [N, C], weight [C] -> out [N, C], rstd [N] (kept for the backward; may be null).
// out may alias x.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps);

// dout [N, C], x [N, C], weight [C], rstd [N] (from the forward) -> ADDS into dx [N, C]
// and dweight [C]. Adding into dx lets a residual block pass dx = dy and get the sum.
// dx must not alias dout or x.
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c);

}  // namespace peakbound::cpu
