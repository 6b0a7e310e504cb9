#include "peakbound/kernels/cpu/gemm_bf16.h"

// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13); the warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/gemm.h"

#define PB_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace peakbound::cpu {

namespace {

// native path: a kMr x kNr tile of fp32 accumulators; blocks of kMc rows, kKc depth
// (kKc / 2 pairs) and kNc columns.
constexpr std::int64_t kMr = 12, kNr = 32, kKc = 384, kMc = 96, kNc = 1024;
// convert path: blocks widened to f32 and handed to sgemm.
constexpr std::int64_t kCvtM = 1024, kCvtK = 512, kCvtN = 2048;
// Below this many multiply-adds the product runs on the caller's thread alone: a
// parallel call costs tens of microseconds on a loaded machine, about what 2^21
// multiply-adds take on one core; attention's 64x64x64 tile products stay on their
// task's thread (they run inside the attention kernel's own pool).
constexpr double kParallelMacs = 1 << 21;
// The pool's workers poll this long after a call before they sleep: a product makes a
// parallel call per K block (two per block with B's packing), and a sleeping worker's
// wake-up costs about as much as a 2^21 multiply-add block on a loaded VM.
constexpr std::chrono::microseconds kPoolSpin{300};

// op(X) of a stored operand: element (r, c) of the row-major [rows, cols] view.
struct Operand {
  const bf16* p;
  std::int64_t ld;
  bool trans;
  std::uint32_t at(std::int64_t r, std::int64_t c) const { return (trans ? p[c * ld + r] : p[r * ld + c]).bits; }
};

std::uint32_t pair(std::uint32_t lo, std::uint32_t hi) { return lo | (hi << 16); }

std::uint32_t load_pair(const bf16* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);  // little-endian: p[0] low, p[1] high
  return u;
}

// One strip of a packed operand: W rows [i0, i0 + W) of `op` (an [M, K] view) over depth
// [k0, k0 + kc), as K pairs of W u32 each, zero past row `rows` (the edge) and past an
// odd kc. A full strip's whole pairs take the stored layout's contiguous direction; the
// edges go element by element. A strips rows of A (W = kMr); B strips rows of B^T
// (W = kNr), i.e. columns of B.
template <std::int64_t W>
void pack_strip(const Operand& op, std::int64_t i0, std::int64_t rows, std::int64_t k0, std::int64_t kc,
                std::uint32_t* out) {
  const std::int64_t pairs = (kc + 1) / 2, whole = kc / 2;
  const bool full = rows >= W;
  if (full && !op.trans) {  // row i holds its K pairs contiguously
    for (std::int64_t r = 0; r < W; ++r) {
      const bf16* row = op.p + (i0 + r) * op.ld + k0;
      for (std::int64_t p = 0; p < whole; ++p) out[p * W + r] = load_pair(row + 2 * p);
    }
  } else if (full) {  // depth k holds rows i contiguously: two depths make the pairs
    for (std::int64_t p = 0; p < whole; ++p) {
      const bf16* lo = op.p + (k0 + 2 * p) * op.ld + i0;
      const bf16* hi = lo + op.ld;
      for (std::int64_t r = 0; r < W; ++r) out[p * W + r] = pair(lo[r].bits, hi[r].bits);
    }
  }
  for (std::int64_t p = full ? whole : 0; p < pairs; ++p) {
    const std::int64_t k = k0 + 2 * p;
    const bool has_hi = 2 * p + 1 < kc;
    for (std::int64_t r = 0; r < W; ++r)
      out[p * W + r] = r >= rows ? 0u : pair(op.at(i0 + r, k), has_hi ? op.at(i0 + r, k + 1) : 0u);
  }
}

// The A block rows [i0, i0 + mc) x depth [k0, k0 + kc) as kMr-row strips.
void pack_a(const Operand& a, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
            std::uint32_t* out) {
  const std::int64_t pairs = (kc + 1) / 2;
  for (std::int64_t s = 0; s < mc; s += kMr, out += pairs * kMr) pack_strip<kMr>(a, i0 + s, mc - s, k0, kc, out);
}

// The strip of columns [j0 + t, j0 + t + kNr) of the B block depth [k0, k0 + kc) x
// columns [j0, j0 + nc), at its own offset in the block's packed buffer `out`.
void pack_b_strip(const Operand& b, std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
                  std::int64_t t, std::uint32_t* out) {
  const Operand bt{b.p, b.ld, !b.trans};  // B^T: bt.at(j, k) == b.at(k, j)
  pack_strip<kNr>(bt, j0 + t, nc - t, k0, kc, out + t / kNr * ((kc + 1) / 2) * kNr);
}

// How a computed tile lands in C: C = alpha * tile (the first K block with beta 0, C
// not read), C = alpha * tile + beta * C (the first block), C += alpha * tile (later ones).
enum class Update : std::uint8_t { write, scale_add, add };

// C[kMr, kNr] (row stride ldc) updated with alpha * the product of the packed A strip
// and the packed B strip over `pairs` K pairs. C's rows are prefetched while the
// products run.
PB_AVX512_BF16 void tile_native(std::int64_t pairs, const std::uint32_t* ap, const std::uint32_t* bp, float* c,
                                std::int64_t ldc, float alpha, float beta, Update update) {
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    if (update != Update::write) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
  }
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
    bp += kNr;
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
    ap += kMr;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    float* row = c + r * ldc;
    for (int h = 0; h < 2; ++h) {
      __m512 v = _mm512_mul_ps(va, acc[r][h]);
      if (update == Update::scale_add) v = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16 * h), v);
      if (update == Update::add) v = _mm512_add_ps(_mm512_loadu_ps(row + 16 * h), v);
      _mm512_storeu_ps(row + 16 * h, v);
    }
  }
}

// An edge tile: rows x cols of C (fewer than kMr x kNr) through a full-size scratch tile.
void edge_tile(std::int64_t pairs, const std::uint32_t* ap, const std::uint32_t* bp, std::int64_t rows,
               std::int64_t cols, float* c, std::int64_t ldc, float alpha, float beta, Update update) {
  alignas(64) float tile[kMr * kNr];
  tile_native(pairs, ap, bp, tile, kNr, 1.0f, 0.0f, Update::write);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) {
      float& out = c[r * ldc + j];
      const float v = alpha * tile[r * kNr + j];
      out = update == Update::write ? v : update == Update::scale_add ? v + beta * out : out + v;
    }
}

// The pool the native path runs on: ops::blas_num_threads() threads, remade when that
// count changes; callers hold a reference while they use it.
std::shared_ptr<ThreadPool> gemm_pool() {
  static std::mutex mu;
  static std::shared_ptr<ThreadPool> pool;
  const int want = std::max(1, blas_num_threads());
  std::lock_guard<std::mutex> lock(mu);
  if (!pool || pool->size() != want) pool = std::make_shared<ThreadPool>(want, kPoolSpin);
  return pool;
}

void run_tasks(std::int64_t tasks, bool parallel, const std::function<void(std::int64_t)>& fn) {
  if (!parallel || tasks == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  auto pool = gemm_pool();
  if (pool->size() == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  pool->parallel_for(tasks, fn);
}

void gemm_native(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const bf16* a,
                 std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const Operand A{a, lda, ta}, B{b, ldb, tb};
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kParallelMacs;
  const std::int64_t threads = std::max(1, blas_num_threads());
  thread_local std::vector<std::uint32_t> bbuf;
  bbuf.resize(static_cast<std::size_t>(kNc * kKc / 2));
  for (std::int64_t jc = 0; jc < n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, n - jc);
    const std::int64_t strips = (nc + kNr - 1) / kNr;
    for (std::int64_t pc = 0; pc < k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, k - pc), pairs = (kc + 1) / 2;
      const Update update = pc > 0 ? Update::add : beta == 0.0f ? Update::write : Update::scale_add;
      std::uint32_t* bpacked = bbuf.data();
      run_tasks(strips, parallel, [&, bpacked](std::int64_t t) { pack_b_strip(B, pc, kc, jc, nc, t * kNr, bpacked); });
      // Each task packs its row block of A once and runs it against a group of column
      // strips; the strips split into groups only when row blocks alone are too few to
      // keep every thread busy (A is then packed once per group).
      const std::int64_t row_blocks = (m + kMc - 1) / kMc;
      const std::int64_t want_groups = parallel ? (2 * threads + row_blocks - 1) / row_blocks : 1;
      const std::int64_t per_group = (strips + std::min(strips, want_groups) - 1) / std::min(strips, want_groups);
      const std::int64_t groups = (strips + per_group - 1) / per_group;
      run_tasks(row_blocks * groups, parallel, [&, bpacked](std::int64_t task) {
        thread_local std::vector<std::uint32_t> abuf;
        abuf.resize(static_cast<std::size_t>(kMc * kKc / 2));
        const std::int64_t ic = task / groups * kMc, mc = std::min(kMc, m - ic);
        pack_a(A, ic, mc, pc, kc, abuf.data());
        const std::int64_t t_end = std::min(strips, (task % groups + 1) * per_group);
        for (std::int64_t t = task % groups * per_group; t < t_end; ++t) {
          const std::int64_t j = t * kNr, cols = std::min(kNr, nc - j);
          for (std::int64_t s = 0; s < mc; s += kMr) {
            const std::uint32_t *ap = abuf.data() + s * pairs, *bp = bpacked + t * pairs * kNr;
            float* ct = c + (ic + s) * ldc + jc + j;
            if (s + kMr <= mc && cols == kNr) tile_native(pairs, ap, bp, ct, ldc, alpha, beta, update);
            else edge_tile(pairs, ap, bp, std::min(kMr, mc - s), cols, ct, ldc, alpha, beta, update);
          }
        }
      });
    }
  }
}

// rows x cols of bf16 (row stride ld) widened into a dense f32 [rows, cols].
void widen(const bf16* in, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* src = &in[r * ld].bits;
    float* dst = out + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::uint32_t u = static_cast<std::uint32_t>(src[j]) << 16;
      std::memcpy(dst + j, &u, sizeof u);
    }
  }
}

void gemm_convert(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const bf16* a,
                  std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  thread_local std::vector<float> af, bf;
  af.resize(static_cast<std::size_t>(kCvtM * kCvtK));
  bf.resize(static_cast<std::size_t>(kCvtK * kCvtN));
  for (std::int64_t jc = 0; jc < n; jc += kCvtN) {
    const std::int64_t nc = std::min(kCvtN, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kCvtK) {
      const std::int64_t kc = std::min(kCvtK, k - pc);
      // Each block keeps its stored orientation: B^T stored [N,K] widens to [nc, kc].
      if (tb) widen(b + jc * ldb + pc, ldb, nc, kc, bf.data());
      else widen(b + pc * ldb + jc, ldb, kc, nc, bf.data());
      for (std::int64_t ic = 0; ic < m; ic += kCvtM) {
        const std::int64_t mc = std::min(kCvtM, m - ic);
        if (ta) widen(a + pc * lda + ic, lda, kc, mc, af.data());
        else widen(a + ic * lda + pc, lda, mc, kc, af.data());
        gemm_f32(ta, tb, mc, nc, kc, alpha, af.data(), ta ? mc : kc, bf.data(), tb ? kc : nc,
                 pc == 0 ? beta : 1.0f, c + ic * ldc + jc, ldc);
      }
    }
  }
}

}  // namespace

std::string_view bf16_gemm_path_name(Bf16GemmPath p) { return p == Bf16GemmPath::native ? "native" : "convert"; }

Bf16GemmPath parse_bf16_gemm_path(std::string_view name) {
  for (Bf16GemmPath p : {Bf16GemmPath::native, Bf16GemmPath::convert})
    if (name == bf16_gemm_path_name(p)) return p;
  throw InvalidArgument("unknown bf16 GEMM path '" + std::string(name) + "' (use native or convert)");
}

bool bf16_gemm_path_supported(Bf16GemmPath p) {
  if (p == Bf16GemmPath::convert) return true;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

Bf16GemmPath best_bf16_gemm_path() {
  return bf16_gemm_path_supported(Bf16GemmPath::native) ? Bf16GemmPath::native : Bf16GemmPath::convert;
}

void gemm_bf16(Bf16GemmPath path, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc) {
  PB_CHECK(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return;
  PB_CHECK_MSG(ldc >= n, "ldc < n");
  if (k == 0) return gemm_f32(trans_a, trans_b, m, n, 0, alpha, nullptr, 1, nullptr, 1, beta, c, ldc);
  PB_CHECK_MSG(lda >= (trans_a ? m : k), "lda too small");
  PB_CHECK_MSG(ldb >= (trans_b ? k : n), "ldb too small");
  if (!bf16_gemm_path_supported(path))
    throw Unavailable("bf16 GEMM path 'native' needs AVX512-BF16, which this CPU lacks (use 'convert')");
  if (path == Bf16GemmPath::native) gemm_native(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else gemm_convert(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace peakbound::cpu
