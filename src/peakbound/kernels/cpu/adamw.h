// AdamW on the CPU: decoupled weight decay, bias correction, eps, an optional
// per-step learning rate, over fp32 master weights, m and v, reading bf16 or fp32
// gradients and writing the parameters in the device's dtype (bf16 rounded to
// nearest even, or fp32). Three bodies compute the same thing: a plain scalar
// reference, AVX2 and AVX-512 (adamw_avx2.cc, adamw_avx512.cc), chosen at run time
// from the CPU's features. All three use one operation order and fuse the same
// multiply-adds explicitly (std::fma in the scalar body): no multiply feeds an add
// outside an explicit fma, so the compiler has nothing to contract and every body
// is bitwise equal to the reference. The math, the step's scalars and the tensor
// description are backend-neutral (ops/adamw_types.h); this file is the CPU kernels
// that implement them (run by ops/adamw.h on the CPU device, and by ops/host_adamw.h
// on host memory for the offloaded optimizer).
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/kernels/adamw_types.h"

namespace peakbound {
class ThreadPool;
}

namespace peakbound::cpu {

// The scalar reference. Throws InvalidArgument for a dtype other than f32/bf16.
void adamw_update_reference(const AdamWStepScalars& s, const AdamWTensors& t);

// One thread, the given level; throws Unavailable if the CPU lacks it.
// t.param may be t.master itself (f32 parameters that are the master weights, as
// torch.optim updates them): then the bodies do not write it a second time.
void adamw_update(SimdLevel level, const AdamWStepScalars& s, const AdamWTensors& t);

// An update whose working set, n * (12 + gradient + parameter bytes), is at least
// kAdamWStreamBytes writes the parameter (written, never read) with non-temporal
// stores: far beyond a last-level cache (32 MiB on the machine measured) the lines
// would be evicted before anyone reads them, and a plain store first reads each line
// for ownership (4 bytes more per f32 parameter, 2 per bf16). A smaller update (an
// offload_stream bucket) keeps plain stores, so its parameters stay in cache for the
// copy that follows. Same bits either way.
inline constexpr std::int64_t kAdamWStreamBytes = std::int64_t{64} << 20;
bool adamw_streams_param(const AdamWTensors& t);

// Spread over the pool in chunks of kAdamWChunk (ops/adamw_types.h); elementwise, so
// the result does not depend on the thread count or the chunking.
void adamw_update_parallel(ThreadPool& pool, SimdLevel level, const AdamWStepScalars& s,
                           const AdamWTensors& t);

// Sum of x[i]^2 in double (x f32 or bf16), for the global gradient norm. The order
// is fixed: blocks of kSquaresBlock elements; in a block, element j goes to lane
// j % kSquaresLanes (x*x fused into the lane's sum); lanes are combined pairwise,
// blocks in order. So the result is bitwise the same for every level and thread count.
inline constexpr std::int64_t kSquaresBlock = 1 << 16;
inline constexpr int kSquaresLanes = 16;
double sum_squares_reference(const void* x, DType dtype, std::int64_t n);
double sum_squares(ThreadPool& pool, SimdLevel level, const void* x, DType dtype, std::int64_t n);

}  // namespace peakbound::cpu
