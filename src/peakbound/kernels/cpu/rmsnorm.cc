#include "peakbound/kernels/cpu/rmsnorm.h"

#include <cmath>

namespace peakbound::cpu {

namespace {

// Row reductions accumulate in double over 8 lanes (element j into lane j % 8, in order;
// then the fixed tree ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))): C can be 8K wide, and
// independent lanes let the compiler vectorise the sum where one running sum was a chain
// of dependent adds (the forward took 2% of a 4-rank step). The order is the same at any
// vector width, so every CPU kind gives the same bits. Written once over the storage
// type T of x, weight, out, dout, dx (core/dtype.h); rstd and dweight are fp32 for both.
constexpr int kLanes = 8;

// The sum of term(j) (a double) over j in [0, c), in the lane order above.
template <typename F>
double lane_sum(std::int64_t c, F term) {
  double lanes[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
  for (; j < c; ++j) lanes[j % kLanes] += term(j);
  const double* a = lanes;
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

template <typename T>
void rmsnorm_forward_t(T* out, float* rstd, const T* x, const T* weight, std::int64_t n, std::int64_t c, float eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    T* oi = out + i * c;  // may be xi: each element is read before it is written
    const double ss = lane_sum(c, [xi](std::int64_t j) {
      const double v = widen(xi[j]);
      return v * v;
    });
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
    // sum_j w_j g_j (x_j r), each term formed in double from the fp32 product x_j r.
    const double dot = lane_sum(c, [&](std::int64_t j) {
      return static_cast<double>(widen(weight[j])) * widen(gi[j]) * (widen(xi[j]) * r);
    });
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
