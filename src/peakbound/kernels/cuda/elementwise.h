// Elementwise and row kernels of the CUDA backend, llm.c style: free functions over raw
// device pointers, each launched on `stream` (a cudaStream_t) and returning at once.
// The math, and what is written and what is added into, are exactly the CPU kernels'
// (kernels/cpu/elementwise.h, swiglu.h, rmsnorm.h); the gpu tests compare the two on
// the same inputs. Row reductions accumulate in double, as on the CPU. No CUDA header
// here: the op layer includes this in any build and calls it only in CUDA builds.
#pragma once

#include <cstdint>

namespace peakbound::cuda {

void fill(void* stream, float* x, std::int64_t n, float v);                       // x = v
void scale(void* stream, float* x, std::int64_t n, float a);                      // x *= a
void axpy(void* stream, float* y, const float* x, std::int64_t n, float a);       // y += a x
void add(void* stream, float* out, const float* a, const float* b, std::int64_t n);  // out = a + b

// out = silu(gate) * up (out may alias gate or up); backward WRITES dgate and dup.
void swiglu_forward(void* stream, float* out, const float* gate, const float* up, std::int64_t n);
void swiglu_backward(void* stream, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n);

// x [N, C], weight [C] -> out [N, C] (may alias x), rstd [N] (may be null).
void rmsnorm_forward(void* stream, float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps);
// ADDS into dx [N, C] (not aliasing dout or x) and dweight [C] (a column sum over rows,
// in row order: deterministic).
void rmsnorm_backward(void* stream, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c);

}  // namespace peakbound::cuda
