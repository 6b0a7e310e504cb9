// GEMM through the device's backend (OpenBLAS on the CPU device), row-major f32:
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, written (beta = 0) or added into
// (beta = 1). With trans_a, A is stored [K,M]; with trans_b, B is stored [N,K].
// Leading dimensions are row strides.
#pragma once

#include <cstdint>
#include <string>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void gemm(Device& dev, Stream& s, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

// The host's BLAS (OpenBLAS, run by the CPU device and host compute): the core type its
// kernels were chosen for ("Haswell", "SkylakeX", ...) and its thread count.
std::string blas_core_name();
int blas_num_threads();

// The host's BLAS threads shared among the ranks the launcher put on this machine
// (hardware threads / local ranks, at least 1), so co-located ranks do not oversubscribe.
void share_host_cores_among_local_ranks();

}  // namespace peakbound::ops
