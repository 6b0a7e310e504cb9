#include "peakbound/kernels/cpu/row_gate.h"

#include <cmath>

namespace peakbound::cpu {

namespace {

// 1 / (1 + e^-z): for z << 0, e^-z overflows to inf and the result is 0, as it should be.
inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

}  // namespace

void row_gate_forward(float* out, const float* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate) {
  for (std::int64_t r = 0; r < m; ++r) {
    const float s = sigmoid(z[r]);
    float* o = out + r * n;
    const float* xr = x + r * n;
    if (accumulate)
      for (std::int64_t j = 0; j < n; ++j) o[j] += s * xr[j];
    else
      for (std::int64_t j = 0; j < n; ++j) o[j] = s * xr[j];
  }
}

void row_gate_backward(float* dx, float* dz, const float* dout, const float* x, const float* z, std::int64_t m,
                       std::int64_t n) {
  for (std::int64_t r = 0; r < m; ++r) {
    const float s = sigmoid(z[r]);
    const float* d = dout + r * n;
    const float* xr = x + r * n;
    double dot = 0;  // one row's reduction, in double: n is the hidden size
    for (std::int64_t j = 0; j < n; ++j) dot += static_cast<double>(d[j]) * xr[j];
    for (std::int64_t j = 0; j < n; ++j) dx[r * n + j] = s * d[j];
    dz[r] = static_cast<float>(dot) * s * (1.0f - s);
  }
}

}  // namespace peakbound::cpu
