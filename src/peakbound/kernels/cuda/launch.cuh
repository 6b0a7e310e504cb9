// Launch glue shared by the CUDA kernels (.cu files only): the block size, a grid for
// a grid-stride loop over n elements, and the check after a launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound::cuda {

constexpr int kThreads = 256;

inline cudaStream_t native(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks for n elements, capped (a grid-stride loop covers the rest).
inline unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

// One block per row: rows beyond a grid's x dimension are refused by name.
inline unsigned row_blocks(std::int64_t rows, const char* what) {
  if (rows > 0x7fffffff) throw InvalidArgument(std::string("cuda ") + what + ": " + std::to_string(rows) + " rows exceed one grid");
  return static_cast<unsigned>(rows);
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("cuda kernel ") + what + ": " + cudaGetErrorString(e));
}

__device__ inline std::int64_t first_index() { return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// A block's sum in double (blockDim.x == kThreads), returned to every thread.
__device__ inline double block_sum(double v) {
  __shared__ double part[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < kThreads / 32; ++w) t += part[w];
  __syncthreads();  // part is reused by the next call
  return t;
}

// 1 / (1 + e^-x), as the CPU kernels: expf (not __expf), and 0 for x << 0.
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

}  // namespace peakbound::cuda
