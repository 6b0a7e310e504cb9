#include "peakbound/kernels/cpu/rmsnorm.h"

#include <cmath>

namespace peakbound::cpu {

// Row reductions accumulate in double: C can be 8K wide, and the cost is one pass per
// row either way (the kernel is memory-bound).
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float* oi = out + i * c;
    double ss = 0;
    for (std::int64_t j = 0; j < c; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
    for (std::int64_t j = 0; j < c; ++j) oi[j] = xi[j] * r * weight[j];
    if (rstd) rstd[i] = r;
  }
}

// With xhat = x * r: dx_j = r * (w_j dout_j - xhat_j * mean_k(w_k dout_k xhat_k)),
// dweight_j = sum_n dout_j xhat_j.
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    const float* gi = dout + i * c;
    float* dxi = dx + i * c;
    const float r = rstd[i];
    double dot = 0;
    for (std::int64_t j = 0; j < c; ++j) dot += static_cast<double>(weight[j]) * gi[j] * (xi[j] * r);
    const float mean = static_cast<float>(dot / static_cast<double>(c));
    for (std::int64_t j = 0; j < c; ++j) {
      const float xhat = xi[j] * r;
      dxi[j] += r * (weight[j] * gi[j] - xhat * mean);
      dweight[j] += gi[j] * xhat;
    }
  }
}

}  // namespace peakbound::cpu
