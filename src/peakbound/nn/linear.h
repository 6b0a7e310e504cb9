// linear: an activation (f32 or bf16) = a sum of products, optionally added into what it
// already holds, written once for every layer that computes one (docs/precision.md):
//
//   out[m, n] (=|+=) sum_i a_i[m, k_i] op(b_i)[k_i, n]     op(b) = b^T with trans_b
//
// f32: exactly one ops::gemm per term, in order (the first with beta 0, or 1 in add
// mode; the later ones with beta 1), so a caller that moves its gemm calls here keeps
// its bits.
// bf16: row tiles of kLinearTileRows (a constant, so results do not depend on how a
// caller splits its rows). Per tile: in add mode out's rows are widened into the fp32
// tile; each term's ops::gemm_bf16 accumulates into the tile (beta 0 for the first in
// write mode, else 1); the tile is narrowed once into out. A sum of several products
// therefore rounds once, and out is bitwise to_bf16 of one full-m gemm_bf16 per term
// into an fp32 C (holding the widened out in add mode): always on the native GEMM path;
// on the convert path when OpenBLAS's sgemm gives a row the same bits whichever of its
// threads computes it (its Haswell kernels at 2 threads do not: tests/nn/linear_test.cc).
//
// Weight gradients (add_weight_grad below) need no tile: ops::gemm with bf16 operands and
// beta 1 adds straight into the fp32 gradient.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "peakbound/core/dtype.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"

namespace peakbound {

// The rows of one bf16 tile: fixed, so bf16 bits do not depend on the schedule.
inline constexpr std::int64_t kLinearTileRows = 256;

enum class LinearMode : std::uint8_t {
  write,  // out = sum (out is not read)
  add,    // out += sum
};

// One product a op(b): a is [m, k] (row stride lda); b is [n, k] with trans_b, else
// [k, n] (row stride ldb). Both are read.
template <class T>
struct LinearTerm {
  const T* a = nullptr;
  std::int64_t lda = 0;
  const T* b = nullptr;
  std::int64_t ldb = 0;
  std::int64_t k = 0;
  bool trans_b = false;
};

// The fp32 tile a bf16 linear of `rows` x `width` needs: [min(rows, kLinearTileRows),
// width] floats under bf16, 0 bytes under f32 (no allocation, nothing accounted). A
// caller computing several widths passes the widest.
BufferSpec linear_tile_spec(std::int64_t rows, std::int64_t width, Precision p, Component c);

// out [m, n] (row stride ldc): written (LinearMode::write) or added into (add) with the
// sum of `terms` (at least one). out must not overlap any operand. m = 0 does nothing.
// f32: `tile` is not used (may be null).
void linear(Device& dev, Stream& s, std::int64_t m, std::int64_t n, std::initializer_list<LinearTerm<float>> terms,
            float* out, std::int64_t ldc, LinearMode mode, float* tile = nullptr);
// bf16: `tile` is scratch of linear_tile_spec(m, n, Precision::bf16, ...) bytes or more,
// overwritten (it holds the fp32 sums of each row tile before they are narrowed).
void linear(Device& dev, Stream& s, std::int64_t m, std::int64_t n, std::initializer_list<LinearTerm<bf16>> terms,
            bf16* out, std::int64_t ldc, LinearMode mode, float* tile);

// A weight gradient, A = float | bf16: dw [rows, cols] += a^T b, a [m, rows], b [m, cols].
// ADDS INTO dw, which is fp32 in both precisions (one ops::gemm with beta 1: bf16 operands
// accumulate in fp32 straight into it). m = 0 adds nothing.
template <class A>
void add_weight_grad(Device& dev, Stream& s, std::int64_t rows, std::int64_t cols, std::int64_t m, const A* a,
                     const A* b, float* dw);

}  // namespace peakbound
