// RMSNorm over the last dimension, llm.c style: free functions over raw row-major
// pointers. out[n, c] = x[n, c] * rstd[n] * weight[c], rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps).
// Used by the residual test block now and by the transformer blocks later.
//
// bf16 forms: x, weight, out, dout and dx bf16; rstd and dweight stay fp32 (a statistic
// and a parameter gradient). Computed in fp32 (row sums in double) exactly as the f32
// forms and rounded once where a bf16 tensor is stored: bf16 outputs are bitwise
// to_bf16(the f32 form's outputs on the widened inputs, dx's prior contents included),
// fp32 outputs bitwise the f32 form's.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

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

// x, weight bf16 -> out bf16 (may alias x), rstd fp32.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* weight, std::int64_t n, std::int64_t c,
                     float eps);
// dout, x, weight bf16, rstd fp32 -> ADDS into dx bf16 (rounded once per element) and
// dweight fp32.
void rmsnorm_backward(bf16* dx, float* dweight, const bf16* dout, const bf16* x, const bf16* weight,
                      const float* rstd, std::int64_t n, std::int64_t c);

}  // namespace peakbound::cpu
