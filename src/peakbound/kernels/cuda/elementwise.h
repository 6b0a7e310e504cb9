// Elementwise and row kernels of the CUDA backend, llm.c style: free functions over raw
// device pointers, each launched on `stream` (a cudaStream_t) and returning at once.
// The math, and what is written and what is added into, are exactly the CPU kernels'
// (kernels/cpu/elementwise.h, swiglu.h, rmsnorm.h); the gpu tests compare the two on
// the same inputs. Row reductions accumulate in double, as on the CPU. No CUDA header
// here: the op layer includes this in any build and calls it only in CUDA builds.
//
// The bf16 forms take the tensors the CPU bf16 forms do in bf16 (rstd and dweight stay
// fp32) and are the same templates as the f32 kernels: widen each load, compute in fp32
// as the f32 kernel, round once at each bf16 store with core/dtype.h's to_bf16 bit for
// bit (ties to even, NaN quieted with its sign). So a CUDA bf16 output is bitwise
// to_bf16(the CUDA f32 kernel's output on the widened inputs); convert, fill and add are
// bitwise the CPU's, the others differ from the CPU only as the f32 kernels do (fused
// multiply-adds, expf, the block's order of a row sum), then rounded.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cuda {

void fill(void* stream, float* x, std::int64_t n, float v);                       // x = v
void scale(void* stream, float* x, std::int64_t n, float a);                      // x *= a
void axpy(void* stream, float* y, const float* x, std::int64_t n, float a);       // y += a x
void add(void* stream, float* out, const float* a, const float* b, std::int64_t n);  // out = a + b
void fill(void* stream, bf16* x, std::int64_t n, float v);                        // x = bf16(v)
void axpy(void* stream, bf16* y, const bf16* x, std::int64_t n, float a);         // y = bf16(y + a x)
void add(void* stream, bf16* out, const bf16* a, const bf16* b, std::int64_t n);  // out = bf16(a + b)
// out [n] = to_bf16(in) / to_f32(in), not overlapping in.
void convert(void* stream, bf16* out, const float* in, std::int64_t n);
void convert(void* stream, float* out, const bf16* in, std::int64_t n);

// out = silu(gate) * up (out may alias gate or up); backward WRITES dgate and dup.
void swiglu_forward(void* stream, float* out, const float* gate, const float* up, std::int64_t n);
void swiglu_backward(void* stream, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::int64_t n);
void swiglu_forward(void* stream, bf16* out, const bf16* gate, const bf16* up, std::int64_t n);
void swiglu_backward(void* stream, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                     std::int64_t n);

// x [N, C], weight [C] -> out [N, C] (may alias x), rstd [N] (may be null).
void rmsnorm_forward(void* stream, float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps);
// ADDS into dx [N, C] (not aliasing dout or x) and dweight [C] (a column sum over rows,
// in row order: deterministic).
void rmsnorm_backward(void* stream, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c);
// bf16 x, weight, out, dout, dx; fp32 rstd, dweight.
void rmsnorm_forward(void* stream, bf16* out, float* rstd, const bf16* x, const bf16* weight, std::int64_t n,
                     std::int64_t c, float eps);
void rmsnorm_backward(void* stream, bf16* dx, float* dweight, const bf16* dout, const bf16* x, const bf16* weight,
                      const float* rstd, std::int64_t n, std::int64_t c);

}  // namespace peakbound::cuda
