#include "peakbound/kernels/cpu/row_gate.h"

#include <cmath>

namespace peakbound::cpu {

namespace {

// 1 / (1 + e^-z): for z << 0, e^-z overflows to inf and the result is 0, as it should be.
inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// S: the storage of x, out, dout, dx and dz (float or bf16); z is fp32 in both.
template <typename S>
void forward(S* out, const S* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate) {
  for (std::int64_t r = 0; r < m; ++r) {
    const float s = sigmoid(z[r]);
    S* o = out + r * n;
    const S* xr = x + r * n;
    if (accumulate)
      for (std::int64_t j = 0; j < n; ++j) o[j] = narrow<S>(widen(o[j]) + s * widen(xr[j]));
    else
      for (std::int64_t j = 0; j < n; ++j) o[j] = narrow<S>(s * widen(xr[j]));
  }
}

template <typename S>
void backward(S* dx, S* dz, const S* dout, const S* x, const float* z, std::int64_t m, std::int64_t n) {
  for (std::int64_t r = 0; r < m; ++r) {
    const float s = sigmoid(z[r]);
    const S* d = dout + r * n;
    const S* xr = x + r * n;
    double dot = 0;  // one row's reduction, in double: n is the hidden size
    for (std::int64_t j = 0; j < n; ++j) dot += static_cast<double>(widen(d[j])) * widen(xr[j]);
    for (std::int64_t j = 0; j < n; ++j) dx[r * n + j] = narrow<S>(s * widen(d[j]));
    dz[r] = narrow<S>(static_cast<float>(dot) * s * (1.0f - s));
  }
}

}  // namespace

void row_gate_forward(float* out, const float* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate) {
  forward(out, x, z, m, n, accumulate);
}

void row_gate_forward(bf16* out, const bf16* x, const float* z, std::int64_t m, std::int64_t n, bool accumulate) {
  forward(out, x, z, m, n, accumulate);
}

void row_gate_backward(float* dx, float* dz, const float* dout, const float* x, const float* z, std::int64_t m,
                       std::int64_t n) {
  backward(dx, dz, dout, x, z, m, n);
}

void row_gate_backward(bf16* dx, bf16* dz, const bf16* dout, const bf16* x, const float* z, std::int64_t m,
                       std::int64_t n) {
  backward(dx, dz, dout, x, z, m, n);
}

}  // namespace peakbound::cpu
