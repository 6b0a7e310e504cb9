#include "peakbound/kernels/cpu/rmsnorm.h"

#include <cmath>

namespace peakbound::cpu {

namespace {

// Row reductions accumulate in double: C can be 8K wide, and the cost is one pass per
// row either way (the kernel is memory-bound). Written once over the storage type T of
// x, weight, out, dout, dx (core/dtype.h); rstd and dweight are fp32 for both.
template <typename T>
void rmsnorm_forward_t(T* out, float* rstd, const T* x, const T* weight, std::int64_t n, std::int64_t c, float eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    T* oi = out + i * c;
    double ss = 0;
    for (std::int64_t j = 0; j < c; ++j) ss += static_cast<double>(widen(xi[j])) * widen(xi[j]);
    float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
    for (std::int64_t j = 0; j < c; ++j) oi[j] = narrow<T>(widen(xi[j]) * r * widen(weight[j]));
    if (rstd) rstd[i] = r;
  }
}

// With xhat = x * r: dx_j = r * (w_j dout_j - xhat_j * mean_k(w_k dout_k xhat_k)),
// dweight_j = sum_n dout_j xhat_j.
template <typename T>
void rmsnorm_backward_t(T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd,
                        std::int64_t n, std::int64_t c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    const T* gi = dout + i * c;
    T* dxi = dx + i * c;
    const float r = rstd[i];
    double dot = 0;
    for (std::int64_t j = 0; j < c; ++j)
      dot += static_cast<double>(widen(weight[j])) * widen(gi[j]) * (widen(xi[j]) * r);
    const float mean = static_cast<float>(dot / static_cast<double>(c));
    for (std::int64_t j = 0; j < c; ++j) {
      const float xhat = widen(xi[j]) * r;
      const float g = widen(gi[j]);
      dxi[j] = narrow<T>(widen(dxi[j]) + r * (widen(weight[j]) * g - xhat * mean));
      dweight[j] += g * xhat;
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, std::int64_t n,
                     std::int64_t c, float eps) {
  rmsnorm_forward_t(out, rstd, x, weight, n, c, eps);
}
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* weight, std::int64_t n, std::int64_t c,
                     float eps) {
  rmsnorm_forward_t(out, rstd, x, weight, n, c, eps);
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(dx, dweight, dout, x, weight, rstd, n, c);
}
void rmsnorm_backward(bf16* dx, float* dweight, const bf16* dout, const bf16* x, const bf16* weight,
                      const float* rstd, std::int64_t n, std::int64_t c) {
  rmsnorm_backward_t(dx, dweight, dout, x, weight, rstd, n, c);
}

}  // namespace peakbound::cpu
