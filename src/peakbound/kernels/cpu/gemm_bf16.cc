#include "peakbound/kernels/cpu/gemm_bf16.h"

// GCC 12's AVX-512 intrinsics seed their pass-through operand with a deliberately
// uninitialised _mm512_undefined_*(), which -Wmaybe-uninitialized reports wrongly
// (GCC bug 105593, fixed in GCC 13), and -Wuninitialized at -O1 (the sanitizer build) where
// the vectors sit in an array (the 16 x 16 transpose); both warnings are off for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/bf16_lanes.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/gemm.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define PB_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define PB_AMX_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

namespace peakbound::cpu {

namespace {

// native path: a kMr x kNr tile of fp32 accumulators; blocks of kMc rows, kKc depth
// (kKc / 2 pairs) and kNc columns.
constexpr std::int64_t kMr = 12, kNr = 32, kKc = 384, kMc = 96, kNc = 1024;
// Up to this many rows of a non-transposed A and columns of C, a product is one parallel
// call over column strips (gemm_columns): each task packs its B strip and runs every row
// on it, A read in place (at most 384 KiB of it per K block, from L2), never packed.
// Larger products pack A per 96-row block, where the tile's broadcasts use constant
// offsets, and make two parallel calls per K block (B's packing, then the row blocks).
constexpr std::int64_t kColumnTaskRows = 512, kColumnTaskCols = 512;
static_assert(kColumnTaskCols <= kNc, "gemm_columns keeps every strip's B block in the kNc x kKc buffer");
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

// 16 rows of 16 u32 transposed in registers: afterwards r[q] lane i is the old r[i] lane q.
PB_AVX512_BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// Whole pairs [0, whole) of n <= 16 rows (row i at rows + i * ld bf16s, its pairs
// contiguous) as pair-major u32: out[p * W + i] for i < n (W = 12: an A strip; W = 32: a
// half of a B strip, the other half another call's).
PB_AVX512_BF16 void pack_rows16(const bf16* rows, std::int64_t ld, std::int64_t n, std::int64_t whole,
                                std::int64_t W, std::uint32_t* out) {
  const __mmask16 rows_mask = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
  for (std::int64_t p0 = 0; p0 < whole; p0 += 16) {
    const std::int64_t q_end = std::min<std::int64_t>(16, whole - p0);
    const __mmask16 mask = static_cast<__mmask16>(q_end == 16 ? 0xFFFF : (1u << q_end) - 1);
    __m512i r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < n ? _mm512_maskz_loadu_epi32(mask, rows + i * ld + 2 * p0) : _mm512_setzero_si512();
    transpose16(r);
    for (std::int64_t q = 0; q < q_end; ++q) _mm512_mask_storeu_epi32(out + (p0 + q) * W, rows_mask, r[q]);
  }
}

// Index vectors for VPERMT2W, built at compile time (static storage, no guard on the
// packing's hot path). kInterleave[h]: lanes 2i, 2i + 1 of the result take lane 16h + i of
// the first operand (the low depth) and of the second (the high depth): pairs 16h..16h+15
// of two 32-wide depth rows.
using Idx32 = std::array<std::uint16_t, 32>;
constexpr Idx32 interleave_index(int h) {
  Idx32 idx{};
  for (int i = 0; i < 16; ++i) {
    idx[static_cast<std::size_t>(2 * i)] = static_cast<std::uint16_t>(16 * h + i);
    idx[static_cast<std::size_t>(2 * i + 1)] = static_cast<std::uint16_t>(32 + 16 * h + i);
  }
  return idx;
}
alignas(64) constexpr Idx32 kInterleave[2] = {interleave_index(0), interleave_index(1)};

// A transposed view's 12-row strip four pairs at a time (pack_strip12_transposed): Z[q]
// holds pair q's depths, 2q in lanes 0-15 and 2q + 1 in lanes 16-31 (rows 0-11 of each).
// Output register o holds words 16o .. 16o + 15 of the 48 (word c: pair c / 12, row
// c % 12; bf16 lane 2i its low depth, 2i + 1 its high), which lie in pairs o and o + 1:
// kStrip12[o] indexes the registers (Z[o], Z[o + 1]).
constexpr Idx32 strip12_index(int o) {
  Idx32 idx{};
  for (int lane = 0; lane < 32; ++lane) {
    const int word = (32 * o + lane) / 2, q = word / 12, row = word % 12, high = lane % 2;
    const int operand = q - o;  // Z[o] or Z[o + 1]
    idx[static_cast<std::size_t>(lane)] = static_cast<std::uint16_t>(32 * operand + 16 * high + row);
  }
  return idx;
}
alignas(64) constexpr Idx32 kStrip12[3] = {strip12_index(0), strip12_index(1), strip12_index(2)};

PB_AVX512_BF16 inline __m512i load_index(const Idx32& idx) { return _mm512_load_si512(idx.data()); }

// W u32 (W <= 32) of pairs (lo[i], hi[i]) for i < w, zero for i >= w; hi null: zero high halves.
PB_AVX512_BF16 inline void interleave_pairs(const bf16* lo, const bf16* hi, std::int64_t w, std::int64_t W,
                                            std::uint32_t* out) {
  const __mmask32 m = w >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << w) - 1);
  const __m512i l = _mm512_maskz_loadu_epi16(m, lo);
  const __m512i h = hi ? _mm512_maskz_loadu_epi16(m, hi) : _mm512_setzero_si512();
  const __m512i v0 = _mm512_permutex2var_epi16(l, load_index(kInterleave[0]), h);
  if (W == 32) {
    _mm512_storeu_si512(out, v0);
    _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi16(l, load_index(kInterleave[1]), h));
  } else {
    _mm512_mask_storeu_epi32(out, static_cast<__mmask16>((1u << W) - 1), v0);
  }
}

// Depth rows d (lanes 0-15) and d + ld (lanes 16-31), each its first elements under m
// (w <= 16 lanes, so each row's load fills lanes 0-15 at most).
PB_AVX512_BF16 inline __m512i two_depths(const bf16* d, std::int64_t ld, __mmask32 m) {
  const __m512i hi = _mm512_maskz_loadu_epi16(m, d + ld);
  return _mm512_inserti64x4(_mm512_maskz_loadu_epi16(m, d), _mm512_castsi512_si256(hi), 1);
}

// A transposed view's 12-row strip (depth k holds the rows contiguously), four pairs at a
// time: eight depth rows of w <= 12 elements (zero past w) into two registers per two
// pairs, three permutes and three whole stores of the 48 u32; the pairs past the last
// multiple of four go one at a time. The words are interleave_pairs's.
PB_AVX512_BF16 void pack_strip12_transposed(const Operand& op, std::int64_t i0, std::int64_t w, std::int64_t k0,
                                            std::int64_t kc, std::uint32_t* out) {
  const std::int64_t pairs = (kc + 1) / 2, whole4 = kc / 8 * 4;
  const __mmask32 m = static_cast<__mmask32>((1u << w) - 1);
  const bf16* base = op.p + k0 * op.ld + i0;
  const __m512i i0v = load_index(kStrip12[0]), i1v = load_index(kStrip12[1]), i2v = load_index(kStrip12[2]);
  std::int64_t p = 0;
  for (; p < whole4; p += 4) {
    const bf16* d = base + 2 * p * op.ld;
    const __m512i z0 = two_depths(d, op.ld, m), z1 = two_depths(d + 2 * op.ld, op.ld, m),
                  z2 = two_depths(d + 4 * op.ld, op.ld, m), z3 = two_depths(d + 6 * op.ld, op.ld, m);
    std::uint32_t* o = out + p * kMr;
    _mm512_storeu_si512(o, _mm512_permutex2var_epi16(z0, i0v, z1));
    _mm512_storeu_si512(o + 16, _mm512_permutex2var_epi16(z1, i1v, z2));
    _mm512_storeu_si512(o + 32, _mm512_permutex2var_epi16(z2, i2v, z3));
  }
  for (; p < pairs; ++p) {
    const bf16* lo = base + 2 * p * op.ld;
    interleave_pairs(lo, 2 * p + 1 < kc ? lo + op.ld : nullptr, w, kMr, out + p * kMr);
  }
}

// One strip of a packed operand: W rows [i0, i0 + W) of `op` (an [M, K] view) over depth
// [k0, k0 + kc), as K pairs of W u32 each, zero past row `rows` (the edge) and past an
// odd kc. Transposed views interleave two depths in registers; a full strip of a row-major
// view transposes 16 x 16 blocks of pairs; the rest goes element by element. A strips
// rows of A (W = kMr), B strips rows of B^T (W = kNr), i.e. columns of B.
template <std::int64_t W>
PB_AVX512_BF16 void pack_strip(const Operand& op, std::int64_t i0, std::int64_t rows, std::int64_t k0,
                               std::int64_t kc, std::uint32_t* out) {
  const std::int64_t pairs = (kc + 1) / 2, whole = kc / 2, w = std::min(W, rows);
  if (op.trans) {  // depth k holds rows i contiguously: two depths make the pairs
    if constexpr (W == kMr) return pack_strip12_transposed(op, i0, w, k0, kc, out);
    for (std::int64_t p = 0; p < pairs; ++p) {
      const bf16* lo = op.p + (k0 + 2 * p) * op.ld + i0;
      interleave_pairs(lo, 2 * p + 1 < kc ? lo + op.ld : nullptr, w, W, out + p * W);
    }
    return;
  }
  std::int64_t done = 0;
  if (rows >= W) {
    for (std::int64_t h = 0; h < W; h += 16)
      pack_rows16(op.p + (i0 + h) * op.ld + k0, op.ld, std::min<std::int64_t>(16, W - h), whole, W, out + h);
    done = whole;
  }
  for (std::int64_t p = done; p < pairs; ++p) {
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

// Where a tile reads A's K pairs: pair p of the tile's row r is the u32 at bytes
// p + r * rs + p * ps onwards. A packed strip: rs 4, ps 4 * kMr; A read in place (not
// transposed): rs 2 * lda, ps 4.
struct ASrc {
  const unsigned char* p;
  std::int64_t rs, ps;
};

// C[R, cols] (cols <= kNr, row stride ldc) updated with alpha * (R rows of A via `a`) x
// (the packed B strip) over `pairs` K pairs, and with Odd one more pair whose A high
// half is taken as zero (A's odd last K read in place; B's packed high half is zero there
// too). Every element is the same fp32 arithmetic whatever R, cols and where A lives, so
// a row of C does not depend on M or on which rows share the tile. C's rows are
// prefetched while the products run.
template <int R, bool Packed, bool Odd>
PB_AVX512_BF16 void tile_native(std::int64_t pairs, ASrc a, const std::uint32_t* bp, std::int64_t cols,
                                float* c, std::int64_t ldc, float alpha, float beta, Update update) {
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    if (update != Update::write) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
  }
  const unsigned char* ap = a.p;
  // A packed strip's strides are constants, so the 12 broadcasts use immediate offsets.
  const std::int64_t rs = Packed ? 4 : a.rs, ps = Packed ? 4 * kMr : a.ps;
  for (std::int64_t p = 0; p < pairs; ++p, bp += kNr, ap += ps) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      std::uint32_t u;
      std::memcpy(&u, ap + r * rs, sizeof u);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(u));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  if constexpr (Odd) {  // a template argument: the odd pair's code costs the even tiles nothing
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
    for (int r = 0; r < R; ++r) {
      std::uint16_t lo;
      std::memcpy(&lo, ap + r * rs, sizeof lo);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(lo));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  // The update's three forms each unrolled over the rows with the accumulators named, so
  // they stay in registers: one loop over both halves with the update chosen inside it made
  // GCC spill all 24 to the stack and read them back (about a quarter of a 16-pair tile's
  // time: the flash kernel's score products, K = head dim 32).
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols > 16 ? (1u << (cols - 16)) - 1 : 0);
  if (update == Update::write) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      _mm512_mask_storeu_ps(row, m0, _mm512_mul_ps(va, acc[r][0]));
      _mm512_mask_storeu_ps(row + 16, m1, _mm512_mul_ps(va, acc[r][1]));
    }
  } else if (update == Update::add) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), _mm512_mul_ps(va, acc[r][0])));
      _mm512_mask_storeu_ps(row + 16, m1,
                            _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_mul_ps(va, acc[r][1])));
    }
  } else {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      _mm512_mask_storeu_ps(row, m0, _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), _mm512_mul_ps(va, acc[r][0])));
      _mm512_mask_storeu_ps(row + 16, m1,
                            _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), _mm512_mul_ps(va, acc[r][1])));
    }
  }
}

using TileFn = void (*)(std::int64_t, ASrc, const std::uint32_t*, std::int64_t, float*, std::int64_t, float,
                        float, Update);
template <bool Packed, bool Odd, std::size_t... I>
constexpr std::array<TileFn, sizeof...(I)> tile_table(std::index_sequence<I...>) {
  return {&tile_native<static_cast<int>(I) + 1, Packed, Odd>...};
}
// kTiles[form][r - 1] computes r rows: form 0 reads A in place over whole pairs, 1 a packed
// A (rs 4, ps 4 kMr; its odd last pair padded with zero), 2 A in place with an odd last K.
constexpr std::array<TileFn, kMr> kTiles[3] = {tile_table<false, false>(std::make_index_sequence<kMr>{}),
                                               tile_table<true, false>(std::make_index_sequence<kMr>{}),
                                               tile_table<false, true>(std::make_index_sequence<kMr>{})};

// The pool the native path runs on: ops::blas_num_threads() threads, remade when that
// count changes; callers hold a reference while they use it.
std::shared_ptr<ThreadPool> gemm_pool() {
  static KeptPool kept(kPoolSpin);
  return kept.sized(std::max(1, blas_num_threads()));
}

void run_tasks(std::int64_t tasks, bool parallel, const std::function<void(std::int64_t)>& fn) {
  // One BLAS thread (a rank a core, or the attention kernel's shares running the tile
  // products: ops/attention.cc) runs here without touching the pool, which keeps its size.
  if (!parallel || tasks == 1 || blas_num_threads() <= 1) {
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

// One K block [pc, pc + kc) of a native product, as the tiles see it.
struct Block {
  const Operand& a;
  std::int64_t m, pc, kc;
  float alpha, beta;
  Update update;
  float* c;  // C's column jc + (the strip's offset) is added per strip
  std::int64_t ldc;
};

// Rows [i0, i0 + rows) of A (packed in `abuf`, or with abuf null read in place: A not
// transposed) against packed B strip `bp` (columns j .. j + cols of the block's C).
void run_rows(const Block& k, std::int64_t i0, std::int64_t rows, const std::uint32_t* abuf,
              const std::uint32_t* bp, std::int64_t j, std::int64_t cols) {
  const std::int64_t pairs = (k.kc + 1) / 2;
  for (std::int64_t s = 0; s < rows; s += kMr) {
    const std::int64_t r = std::min(kMr, rows - s);
    float* ct = k.c + (i0 + s) * k.ldc + j;
    if (abuf) {
      const ASrc src{reinterpret_cast<const unsigned char*>(abuf + s * pairs), 4, 4 * kMr};
      kTiles[1][r - 1](pairs, src, bp, cols, ct, k.ldc, k.alpha, k.beta, k.update);
    } else {
      const ASrc src{reinterpret_cast<const unsigned char*>(k.a.p + (i0 + s) * k.a.ld + k.pc), 2 * k.a.ld, 4};
      kTiles[k.kc % 2 == 1 ? 2 : 0][r - 1](k.kc / 2, src, bp, cols, ct, k.ldc, k.alpha, k.beta, k.update);
    }
  }
}

// The tasks of one K block of a blocked product: each packs a row block of A (`rows`
// rows) and runs it against a group of column strips. The strips split into groups only
// when row blocks alone are too few to keep every thread busy (A is then packed once per
// group).
struct TaskSplit {
  std::int64_t rows, strips, row_blocks, per_group, groups;
  TaskSplit(std::int64_t m, std::int64_t rows_, std::int64_t strips_, bool parallel, std::int64_t threads)
      : rows(rows_), strips(strips_), row_blocks((m + rows_ - 1) / rows_) {
    const std::int64_t want = std::min(strips, parallel ? (2 * threads + row_blocks - 1) / row_blocks : 1);
    per_group = (strips + want - 1) / want;
    groups = (strips + per_group - 1) / per_group;
  }
  std::int64_t tasks() const { return row_blocks * groups; }
  std::int64_t row0(std::int64_t task) const { return task / groups * rows; }
  std::int64_t strip0(std::int64_t task) const { return task % groups * per_group; }
  std::int64_t strip_end(std::int64_t task) const { return std::min(strips, (task % groups + 1) * per_group); }
};

// A product of a non-transposed A with M, N <= kColumnTaskRows, kColumnTaskCols: one
// parallel call over column strips; each task takes its strip through every K block in
// order, packing the strip's B block (at a fixed offset of its own in `bbuf`) and running
// every row of A, read in place, against it.
void gemm_columns(const Operand& A, const Operand& B, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  float beta, float* c, std::int64_t ldc, bool parallel, std::uint32_t* bbuf) {
  run_tasks((n + kNr - 1) / kNr, parallel, [&](std::int64_t t) {
    std::uint32_t* bp = bbuf + t * (kKc / 2) * kNr;
    for (std::int64_t pc = 0; pc < k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, k - pc);
      const Update update = pc > 0 ? Update::add : beta == 0.0f ? Update::write : Update::scale_add;
      const Block blk{A, m, pc, kc, alpha, beta, update, c, ldc};
      pack_strip<kNr>(Operand{B.p, B.ld, !B.trans}, t * kNr, n - t * kNr, pc, kc, bp);
      run_rows(blk, 0, m, nullptr, bp, t * kNr, std::min(kNr, n - t * kNr));
    }
  });
}

void gemm_native(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const bf16* a,
                 std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const Operand A{a, lda, ta}, B{b, ldb, tb};
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kParallelMacs;
  const std::int64_t threads = std::max(1, blas_num_threads());
  thread_local std::vector<std::uint32_t> bbuf;
  bbuf.resize(static_cast<std::size_t>(kNc * kKc / 2));
  if (!ta && m <= kColumnTaskRows && n <= kColumnTaskCols)
    return gemm_columns(A, B, m, n, k, alpha, beta, c, ldc, parallel, bbuf.data());
  for (std::int64_t jc = 0; jc < n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, n - jc);
    const std::int64_t strips = (nc + kNr - 1) / kNr;
    for (std::int64_t pc = 0; pc < k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, k - pc), pairs = (kc + 1) / 2;
      const Update update = pc > 0 ? Update::add : beta == 0.0f ? Update::write : Update::scale_add;
      const Block blk{A, m, pc, kc, alpha, beta, update, c + jc, ldc};
      std::uint32_t* bpacked = bbuf.data();
      auto strip = [&, bpacked](std::int64_t t) { return bpacked + t * pairs * kNr; };
      auto cols = [&](std::int64_t t) { return std::min(kNr, nc - t * kNr); };
      run_tasks(strips, parallel, [&, bpacked](std::int64_t t) { pack_b_strip(B, pc, kc, jc, nc, t * kNr, bpacked); });
      const TaskSplit split(m, kMc, strips, parallel, threads);
      run_tasks(split.tasks(), parallel, [&](std::int64_t task) {
        thread_local std::vector<std::uint32_t> abuf;
        const std::int64_t ic = split.row0(task), mc = std::min(kMc, m - ic);
        abuf.resize(static_cast<std::size_t>(kMc * kKc / 2));
        pack_a(A, ic, mc, pc, kc, abuf.data());
        for (std::int64_t t = split.strip0(task); t < split.strip_end(task); ++t)
          run_rows(blk, ic, mc, abuf.data(), strip(t), t * kNr, cols(t));
      });
    }
  }
}

// amx path: the product in 16 x 16 fp32 tiles of the CPU's tile registers, TDPBF16PS
// adding a 16 x 32 bf16 A tile times a 16-pair x 16-column B tile into each. Blocks: K
// kAmxKc (an A row of a block is kAmxKc / 2 u32; B strips are the native path's, their
// pairs padded with zeros to a multiple of 16), kAmxMc rows, the native kNc columns.
constexpr std::int64_t kAmxKc = 512, kAmxMc = 128;

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// 16 u32 pairs (lo[i], hi[i]) for i < w (w <= 16), zero past w; hi null: zero high halves.
PB_AVX512_BF16 inline __m512i pairs16(const bf16* lo, const bf16* hi, std::int64_t w) {
  static const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                              38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __mmask32 m = static_cast<__mmask32>(w >= 16 ? 0xFFFF : (1u << w) - 1);
  const __m512i l = _mm512_maskz_loadu_epi16(m, lo);
  const __m512i h = hi ? _mm512_maskz_loadu_epi16(m, hi) : _mm512_setzero_si512();
  return _mm512_permutex2var_epi16(l, idx, h);
}

// Rows [i0, i0 + mc) of op(A) over depth [k0, k0 + kc) as the A tiles read them: row r at
// out + r * ldp (ldp u32 = 2 ldp bf16, a multiple of 16 pairs), its K pairs contiguous,
// zero past kc and in rows [mc, round_up(mc, 16)). A row-major A is copied row by row; a
// transposed one is interleaved two depths at a time (16 rows x 16 pairs in registers)
// and transposed in registers.
PB_AVX512_BF16 void pack_a_amx(const Operand& a, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
                               std::int64_t ldp, std::uint32_t* out) {
  const std::int64_t rows = round_up(mc, 16), pairs = (kc + 1) / 2;
  if (!a.trans) {
    for (std::int64_t r = 0; r < rows; ++r) {
      auto* row = reinterpret_cast<bf16*>(out + r * ldp);
      const std::int64_t n = r < mc ? kc : 0;
      if (n > 0) std::memcpy(row, a.p + (i0 + r) * a.ld + k0, static_cast<std::size_t>(n) * sizeof(bf16));
      std::fill(row + n, row + 2 * ldp, bf16{});
    }
    return;
  }
  for (std::int64_t r0 = 0; r0 < mc; r0 += 16) {  // rows is mc rounded up: r0 < mc covers them
    const std::int64_t w = std::min<std::int64_t>(16, mc - r0);
    for (std::int64_t p0 = 0; p0 < ldp; p0 += 16) {
      __m512i reg[16];
      for (std::int64_t q = 0; q < 16; ++q) {
        const std::int64_t p = p0 + q;
        if (p >= pairs) {
          reg[q] = _mm512_setzero_si512();
          continue;
        }
        const bf16* lo = a.p + (k0 + 2 * p) * a.ld + i0 + r0;
        reg[q] = pairs16(lo, 2 * p + 1 < kc ? lo + a.ld : nullptr, w);
      }
      transpose16(reg);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + (r0 + i) * ldp + p0, reg[i]);
    }
  }
}

// The tile configuration every AMX call uses: palette 1, tiles 0-7 of 16 rows x 64 bytes
// (C tiles 0-3: 16 x 16 fp32; A tiles 4-5: 16 rows x 32 bf16; B tiles 6-7: 16 pairs x 16
// columns). A thread loads it before its first product; the kernel keeps it across
// context switches, and nothing else in the process configures tiles.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

PB_AMX_BF16 void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

// C[rows, cols] (rows <= 16 MT, cols <= kNr) updated with alpha times the A rows (astride
// bytes apart, MT tiles of 16, a row's K pairs contiguous: packed, or A itself) times the
// packed B strip over `steps` 16-pair steps.
// Every element is the same tile arithmetic whatever rows and cols are (the padding is
// zeros), so a row of C does not depend on M or on which rows share a tile.
template <int MT>
PB_AMX_BF16 void tile_amx(std::int64_t steps, const unsigned char* ap, std::int64_t astride, const std::uint32_t* bp,
                          std::int64_t rows, std::int64_t cols, float* c, std::int64_t ldc, float alpha, float beta,
                          Update update) {
  alignas(64) float acc[32][32];
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (MT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::uint32_t* b = bp + s * 16 * kNr;
    _tile_loadd(4, ap + s * 64, astride);
    _tile_loadd(6, b, kNr * 4);
    _tile_loadd(7, b + 16, kNr * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) {
      _tile_loadd(5, ap + 16 * astride + s * 64, astride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, &acc[0][0], 128);
  _tile_stored(1, &acc[0][16], 128);
  if constexpr (MT == 2) {
    _tile_stored(2, &acc[16][0], 128);
    _tile_stored(3, &acc[16][16], 128);
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 mask[2] = {static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
                             static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols > 16 ? (1u << (cols - 16)) - 1 : 0)};
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    for (int h = 0; h < 2; ++h) {
      __m512 v = _mm512_mul_ps(va, _mm512_load_ps(&acc[r][16 * h]));
      if (update == Update::scale_add) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[h], row + 16 * h), v);
      if (update == Update::add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[h], row + 16 * h), v);
      _mm512_mask_storeu_ps(row + 16 * h, mask[h], v);
    }
  }
}

// Rows [0, mc) of an A block (rows astride bytes apart) against a packed B strip: 32 rows
// at a time, the last 16 or fewer with one A tile. A tile loads 16 rows, so the rows past
// mc must be readable: a packed block's are (zeros), and A read in place passes only
// whole tiles here.
PB_AMX_BF16 void run_rows_amx(const unsigned char* a, std::int64_t astride, std::int64_t mc, const std::uint32_t* bp,
                              std::int64_t steps, float* c, std::int64_t ldc, std::int64_t cols, float alpha,
                              float beta, Update update) {
  configure_tiles();
  std::int64_t s = 0;
  for (; s + 16 < mc; s += 32)
    tile_amx<2>(steps, a + s * astride, astride, bp, std::min<std::int64_t>(32, mc - s), cols, c + s * ldc, ldc,
                alpha, beta, update);
  if (s < mc) tile_amx<1>(steps, a + s * astride, astride, bp, mc - s, cols, c + s * ldc, ldc, alpha, beta, update);
}

void gemm_amx(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const bf16* a,
              std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const Operand A{a, lda, ta}, B{b, ldb, tb};
  const Operand bt{B.p, B.ld, !B.trans};  // B^T: bt.at(j, k) == B.at(k, j)
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kParallelMacs;
  const std::int64_t threads = std::max(1, blas_num_threads());
  thread_local std::vector<std::uint32_t> bbuf;
  bbuf.resize(static_cast<std::size_t>(kNc * kAmxKc / 2));
  for (std::int64_t jc = 0; jc < n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, n - jc);
    const std::int64_t strips = (nc + kNr - 1) / kNr;
    for (std::int64_t pc = 0; pc < k; pc += kAmxKc) {
      const std::int64_t kc = std::min(kAmxKc, k - pc), pairs = (kc + 1) / 2, ldp = round_up(pairs, 16);
      const Update update = pc > 0 ? Update::add : beta == 0.0f ? Update::write : Update::scale_add;
      std::uint32_t* bpacked = bbuf.data();
      run_tasks(strips, parallel, [&, bpacked](std::int64_t t) {
        std::uint32_t* out = bpacked + t * ldp * kNr;
        pack_strip<kNr>(bt, jc + t * kNr, nc - t * kNr, pc, kc, out);
        std::memset(out + pairs * kNr, 0, static_cast<std::size_t>((ldp - pairs) * kNr) * sizeof(std::uint32_t));
      });
      const TaskSplit split(m, kAmxMc, strips, parallel, threads);
      // A row-major A whose block is whole 16-pair steps is read in place (tiles load rows
      // lda apart) for its whole 16-row tiles; the rest is packed. The tiles see the same
      // values either way, so the bits are the same.
      const bool in_place = !A.trans && kc == 2 * ldp;
      run_tasks(split.tasks(), parallel, [&](std::int64_t task) {
        thread_local std::vector<std::uint32_t> abuf;
        const std::int64_t ic = split.row0(task), mc = std::min(kAmxMc, m - ic);
        const std::int64_t direct = in_place ? mc / 16 * 16 : 0;
        abuf.resize(static_cast<std::size_t>(kAmxMc * kAmxKc / 2));
        if (direct < mc) pack_a_amx(A, ic + direct, mc - direct, pc, kc, ldp, abuf.data());
        // A's rows only where it is read in place (for a transposed A this offset is not a row).
        const auto* a_rows = direct > 0 ? reinterpret_cast<const unsigned char*>(A.p + ic * A.ld + pc) : nullptr;
        const auto* packed = reinterpret_cast<const unsigned char*>(abuf.data());
        const std::int64_t lda_bytes = A.ld * static_cast<std::int64_t>(sizeof(bf16)), ldp_bytes = ldp * 4;
        for (std::int64_t t = split.strip0(task); t < split.strip_end(task); ++t) {
          const std::uint32_t* bp = bpacked + t * ldp * kNr;
          float* ct = c + ic * ldc + jc + t * kNr;
          const std::int64_t cols = std::min(kNr, nc - t * kNr);
          if (direct > 0) run_rows_amx(a_rows, lda_bytes, direct, bp, ldp / 16, ct, ldc, cols, alpha, beta, update);
          if (direct < mc)
            run_rows_amx(packed, ldp_bytes, mc - direct, bp, ldp / 16, ct + direct * ldc, ldc, cols, alpha, beta,
                         update);
        }
      });
    }
  }
}

// Linux gives a process the tile registers' state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA); the answer is the process's for good.
bool amx_permitted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// The blocks of A and B widened to f32 and multiplied by sgemm. TA = float: A already holds
// the widened values (each exactly a bf16), so its block is read in place, row stride lda,
// where TA = bf16 widens it into the dense block first: the same sgemm calls on the same
// values (OpenBLAS picks its kernel by shape, never by the leading dimension), so the bits
// are the same.
template <class TA>
void convert_blocks(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const TA* a,
                    std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  constexpr bool kWideA = std::is_same_v<TA, float>;
  thread_local std::vector<float> af, bf;
  if constexpr (!kWideA) af.resize(static_cast<std::size_t>(kCvtM * kCvtK));
  bf.resize(static_cast<std::size_t>(kCvtK * kCvtN));
  for (std::int64_t jc = 0; jc < n; jc += kCvtN) {
    const std::int64_t nc = std::min(kCvtN, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kCvtK) {
      const std::int64_t kc = std::min(kCvtK, k - pc);
      // Each block keeps its stored orientation: B^T stored [N,K] widens to [nc, kc].
      if (tb) widen_bf16_block(b + jc * ldb + pc, ldb, nc, kc, bf.data());
      else widen_bf16_block(b + pc * ldb + jc, ldb, kc, nc, bf.data());
      for (std::int64_t ic = 0; ic < m; ic += kCvtM) {
        const std::int64_t mc = std::min(kCvtM, m - ic);
        const TA* at = ta ? a + pc * lda + ic : a + ic * lda + pc;
        const float* ab = nullptr;
        std::int64_t ldab = lda;
        if constexpr (kWideA) {
          ab = at;
        } else {
          if (ta) widen_bf16_block(at, lda, kc, mc, af.data());
          else widen_bf16_block(at, lda, mc, kc, af.data());
          ab = af.data();
          ldab = ta ? mc : kc;
        }
        gemm_f32(ta, tb, mc, nc, kc, alpha, ab, ldab, bf.data(), tb ? kc : nc, pc == 0 ? beta : 1.0f,
                 c + ic * ldc + jc, ldc);
      }
    }
  }
}

void gemm_convert(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const bf16* a,
                  std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  convert_blocks(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

// A row at a time by the widest conversion the CPU has (elementwise.h's to_f32: 16 lanes
// with AVX-512). The loop here compiled to 8-lane SSE2 and held 10% of the 2-rank
// 4096-token step on an AVX-512 Xeon, most of it in attention's tiles.
void widen_bf16_block(const bf16* in, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* out) {
  for (std::int64_t r = 0; r < rows; ++r) to_f32(out + r * cols, in + r * ld, cols);
}

namespace {

// The checks every entry point makes; false when the call is already done (an empty C, or
// K = 0: C only scaled by beta).
bool product_needed(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    std::int64_t lda, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  PB_CHECK(m >= 0 && n >= 0 && k >= 0);
  if (m == 0 || n == 0) return false;
  PB_CHECK_MSG(ldc >= n, "ldc < n");
  if (k == 0) {
    gemm_f32(trans_a, trans_b, m, n, 0, alpha, nullptr, 1, nullptr, 1, beta, c, ldc);
    return false;
  }
  PB_CHECK_MSG(lda >= (trans_a ? m : k), "lda too small");
  PB_CHECK_MSG(ldb >= (trans_b ? k : n), "ldb too small");
  return true;
}

}  // namespace

void gemm_convert_wide_a(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                         const float* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
                         std::int64_t ldc) {
  if (!product_needed(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, c, ldc)) return;
  convert_blocks(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::string_view bf16_gemm_path_name(Bf16GemmPath p) {
  switch (p) {
    case Bf16GemmPath::amx: return "amx";
    case Bf16GemmPath::native: return "native";
    case Bf16GemmPath::convert: break;
  }
  return "convert";
}

Bf16GemmPath parse_bf16_gemm_path(std::string_view name) {
  for (Bf16GemmPath p : {Bf16GemmPath::amx, Bf16GemmPath::native, Bf16GemmPath::convert})
    if (name == bf16_gemm_path_name(p)) return p;
  throw InvalidArgument("unknown bf16 GEMM path '" + std::string(name) + "' (use amx, native or convert)");
}

bool bf16_gemm_path_supported(Bf16GemmPath p) {
  if (p == Bf16GemmPath::convert) return true;
  const bool avx512_bf16 = simd::cpu_has_avx512_bf16();
  if (p == Bf16GemmPath::native) return avx512_bf16;
  return avx512_bf16 && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") && amx_permitted();
}

std::string_view bf16_gemm_path_needs(Bf16GemmPath p) {
  switch (p) {
    case Bf16GemmPath::amx: return "AMX-BF16 (and the kernel's leave to use the tile registers)";
    case Bf16GemmPath::native: return "AVX512-BF16";
    case Bf16GemmPath::convert: break;
  }
  return "nothing";
}

Bf16GemmPath best_bf16_gemm_path() {
  if (bf16_gemm_path_supported(Bf16GemmPath::amx)) return Bf16GemmPath::amx;
  // native beats convert only where VDPBF16PS outruns the f32 FMAs: AMD (gemm_bf16.h).
  if (bf16_gemm_path_supported(Bf16GemmPath::native) && __builtin_cpu_is("amd")) return Bf16GemmPath::native;
  return Bf16GemmPath::convert;
}

void gemm_bf16(Bf16GemmPath path, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc) {
  if (!product_needed(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, c, ldc)) return;
  if (!bf16_gemm_path_supported(path))
    throw Unavailable("bf16 GEMM path '" + std::string(bf16_gemm_path_name(path)) + "' needs " +
                      std::string(bf16_gemm_path_needs(path)) + ", which this CPU lacks (use 'convert')");
  if (path == Bf16GemmPath::amx) gemm_amx(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else if (path == Bf16GemmPath::native) gemm_native(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else gemm_convert(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace peakbound::cpu
