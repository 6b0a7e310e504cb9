#include "peakbound/nn/linear.h"

#include <algorithm>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {

namespace {

template <class T>
void check_args(std::int64_t m, std::int64_t n, std::initializer_list<LinearTerm<T>> terms, std::int64_t ldc) {
  PB_CHECK_MSG(m >= 0 && n > 0 && ldc >= n, "linear: m must be >= 0, n > 0 and ldc >= n");
  PB_CHECK_MSG(terms.size() > 0, "linear: no products to sum");
  for (const LinearTerm<T>& t : terms)
    PB_CHECK_MSG(t.k > 0 && t.lda >= t.k && t.ldb >= (t.trans_b ? t.k : n), "linear: a term's k or strides");
}

// dst[rows, n] (row stride ld_dst) = src[rows, n] (row stride ld_src) in the other dtype.
template <class D, class S>
void convert_rows(Device& dev, Stream& s, std::int64_t rows, std::int64_t n, D* dst, std::int64_t ld_dst,
                  const S* src, std::int64_t ld_src) {
  if (ld_dst == n && ld_src == n) {
    ops::convert(dev, s, dst, src, rows * n);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) ops::convert(dev, s, dst + r * ld_dst, src + r * ld_src, n);
}

}  // namespace

BufferSpec linear_tile_spec(std::int64_t rows, std::int64_t width, Precision p, Component c) {
  if (rows < 0 || width < 0) throw InvalidArgument("linear: tile rows and width must be >= 0");
  if (p == Precision::f32) return buffer_spec(c, 0, sizeof(float));
  const auto r = static_cast<std::uint64_t>(std::min(rows, kLinearTileRows));
  return buffer_spec(c, checked_mul(r, static_cast<std::uint64_t>(width), "linear tile"), sizeof(float));
}

void linear(Device& dev, Stream& s, std::int64_t m, std::int64_t n, std::initializer_list<LinearTerm<float>> terms,
            float* out, std::int64_t ldc, LinearMode mode, float* /*tile*/) {
  check_args(m, n, terms, ldc);
  if (m == 0) return;
  float beta = mode == LinearMode::add ? 1.0f : 0.0f;
  for (const LinearTerm<float>& t : terms) {
    ops::gemm(dev, s, false, t.trans_b, m, n, t.k, 1.0f, t.a, t.lda, t.b, t.ldb, beta, out, ldc);
    beta = 1.0f;
  }
}

void linear(Device& dev, Stream& s, std::int64_t m, std::int64_t n, std::initializer_list<LinearTerm<bf16>> terms,
            bf16* out, std::int64_t ldc, LinearMode mode, float* tile) {
  check_args(m, n, terms, ldc);
  if (m == 0) return;
  PB_CHECK_MSG(tile != nullptr, "linear: a bf16 linear needs its fp32 tile (linear_tile_spec)");
  for (std::int64_t r0 = 0; r0 < m; r0 += kLinearTileRows) {
    const std::int64_t rows = std::min(kLinearTileRows, m - r0);
    if (mode == LinearMode::add) convert_rows(dev, s, rows, n, tile, n, out + r0 * ldc, ldc);
    float beta = mode == LinearMode::add ? 1.0f : 0.0f;
    for (const LinearTerm<bf16>& t : terms) {
      ops::gemm_bf16(dev, s, false, t.trans_b, rows, n, t.k, 1.0f, t.a + r0 * t.lda, t.lda, t.b, t.ldb, beta, tile, n);
      beta = 1.0f;
    }
    convert_rows(dev, s, rows, n, out + r0 * ldc, ldc, tile, n);
  }
}

template <class A>
void add_weight_grad(Device& dev, Stream& s, std::int64_t rows, std::int64_t cols, std::int64_t m, const A* a,
                     const A* b, float* dw) {
  ops::gemm(dev, s, true, false, rows, cols, m, 1.0f, a, rows, b, cols, 1.0f, dw, cols);
}
template void add_weight_grad<float>(Device&, Stream&, std::int64_t, std::int64_t, std::int64_t, const float*,
                                     const float*, float*);
template void add_weight_grad<bf16>(Device&, Stream&, std::int64_t, std::int64_t, std::int64_t, const bf16*,
                                    const bf16*, float*);

}  // namespace peakbound
