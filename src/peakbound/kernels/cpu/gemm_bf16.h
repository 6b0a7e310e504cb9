// CPU GEMM with bf16 inputs and fp32 accumulation, row-major, the f32 GEMM's contract
// (kernels/cpu/gemm.h) with bf16 operands:
//   C[M,N] (f32) = alpha * op(A)[M,K] * op(B)[K,N] + beta * C
// With trans_a, A is stored [K,M]; with trans_b, B is stored [N,K]. Leading dimensions
// are row strides. beta = 0 writes C without reading it (NaN in C does not leak in);
// K = 0 gives C = beta * C.
//
// Three paths, chosen at run time (best_bf16_gemm_path):
//   amx      where the CPU has AMX-BF16 (Intel Sapphire Rapids and later) and Linux lets
//            the process use the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM, asked
//            once): the native path's blocking with TDPBF16PS as the product, each 32 x 32
//            block of C in four 16 x 16 fp32 tiles, a step adding a 16-row x 32-deep A tile
//            times a 16-pair x 16-column B tile into each. B strips are the native path's
//            (32 columns of K pairs: a B tile is 16 pairs of one half, 128 bytes apart),
//            their pairs padded with zeros to a multiple of 16. A row-major A whose K block
//            is whole 16-pair steps is read in place (the tile loads take rows lda apart)
//            for its whole 16-row tiles; other A blocks are packed as rows of K (copied, or
//            from a transposed A interleaved in pairs and transposed 16 x 16 in registers),
//            zero past K and past the last row to a multiple of 16. Blocks: K 512, M 128,
//            N 1024. The tiles are summed into C once per K block, through a 32 x 32
//            scratch. On a 2-core Sapphire Rapids Xeon: 1.67-1.72 TFLOP/s at 2048^3 on 2
//            threads (1.34-1.41 with A packed), 8x the native path there (whose VDPBF16PS
//            has one port).
//   native   where the CPU has AVX512-BF16: a Goto/BLIS-style blocked GEMM whose inner
//            kernel is VDPBF16PS (a 12x32 tile of fp32 accumulators, each instruction
//            adding two bf16 products per lane). Operands are packed in K pairs:
//              A panel: for each pair p, 12 rows x (A[r,2p], A[r,2p+1])   (one u32 each)
//              B panel: for each pair p, 32 columns x (B[2p,j], B[2p+1,j])
//            with zero padding at the N and odd-K edges; packing transposes 16 x 16
//            blocks of pairs or interleaves two depths in registers. Blocks: KC 384 (a B
//            micro-panel of 24 KiB stays in L1), MC 96 (an A block of 72 KiB in L2),
//            NC 1024 (a B block of 768 KiB), tuned on Zen 4: 2x sgemm's rate on one
//            core; the C tile is updated in the kernel while its rows are prefetched.
//            Tiles of 1-12 rows (the M edge needs no scratch) and 1-32 columns (masked
//            loads and stores of C). Small products (A not transposed, M and N <= 512)
//            do not pack A: the tile reads A's K pairs in place, and a K block is one
//            parallel call over column strips, each task packing its own B strip.
//            Every element of C is the same fp32 arithmetic on every route (the pair
//            order and the 384-deep K blocks are fixed), so a row of C does not depend
//            on M, on which rows share a call, or on the thread count (tested bitwise;
//            the amx path keeps the same property with its own 512-deep blocks: padding
//            adds only zero products).
//   convert  elsewhere (AVX2-only CPUs, and Intel's AVX512-BF16 without AMX): each block
//            of A and B is widened to f32 in its stored orientation and multiplied by
//            OpenBLAS's sgemm; the widening costs O(MK + KN) per block against O(MNK) for
//            the product (0.90-0.95x sgemm's rate at 2048^3 on Zen 4).
// The default takes native only on AMD: Intel issues VDPBF16PS on one port, so its
// 32 products an instruction make no more FLOPs a cycle than the f32 FMAs' two ports, and
// the packing in pairs costs on top. On a 2-core Emerald Rapids Xeon whose AMX the VM
// hides (`peakbound info`, 2048^3, 2 threads): sgemm 248, convert 220, native 154 GFLOP/s,
// and the 832-token cp-4 step 1.45-1.48x faster on convert.
// Debian 12's OpenBLAS (0.3.21) is built without BUILD_BFLOAT16: its header declares
// cblas_sbgemm but the library does not export it, so the native path is this file's.
//
// Numerics: every path accumulates in fp32. The native path's VDPBF16PS and the amx
// path's TDPBF16PS treat bf16 denormal inputs as zero and flush denormal results (the
// instructions ignore MXCSR); products of bf16 values are exact in fp32, so the only
// rounding is the fp32 sums, as in sgemm but each path in its own order. Results of the
// paths differ by fp32 rounding: |C - ref| <= ~K * 2^-24 * sum|a||b|, which the tests
// check against a double reference on every path the CPU runs.
//
// Threads: the product runs on an internal pool of ops::blas_num_threads() threads (the
// caller counts), the same cores OpenBLAS's own threads use for the f32 GEMM; the pool
// follows set_blas_threads. Workspace: the packed (or widened) blocks are fixed-size
// per-thread buffers, like OpenBLAS's own pack buffers, and do not grow with the
// problem: native 0.8 MiB on the calling thread and 72 KiB on each worker; amx 1 MiB on
// the calling thread and 128 KiB on each worker; convert 6 MiB
// on the calling thread (A blocks of 1024 x 512 and B blocks of 512 x 2048 in f32: with
// 256 x 256 x 1024 blocks sgemm ran at 0.73x its own rate on 2 threads, the repacking
// of many small calls; with these 0.93x).
#pragma once

#include <cstdint>
#include <string_view>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

enum class Bf16GemmPath : std::uint8_t { native, convert, amx };

// "amx", "native", "convert"; parse throws InvalidArgument naming the choices.
std::string_view bf16_gemm_path_name(Bf16GemmPath p);
Bf16GemmPath parse_bf16_gemm_path(std::string_view name);
// native needs AVX512-F, -BW and -BF16 (__builtin_cpu_supports); amx needs those, AMX-TILE
// and AMX-BF16, and Linux's leave to use the tile registers (asked once per process);
// convert runs anywhere.
bool bf16_gemm_path_supported(Bf16GemmPath p);
// What a path needs, for an error naming it ("AVX512-BF16", ...).
std::string_view bf16_gemm_path_needs(Bf16GemmPath p);
// amx where supported, else native where supported on an AMD CPU, else convert.
Bf16GemmPath best_bf16_gemm_path();

// Throws Unavailable for a path this CPU cannot run, InternalError for bad dimensions.
void gemm_bf16(Bf16GemmPath path, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc);

// The convert path's product with A given widened: `a` holds fp32 values each exactly a
// bf16 (elementwise.h's round_bf16 leaves them so), B is bf16. The same sgemm calls on the
// same values as gemm_bf16(convert, ...) on A narrowed to bf16, so the same bits, without
// the narrowed copy of A and its widening in every product that reads it (Ring-DTP's
// logits gradient feeds two: schedules/ring_dtp.cc).
void gemm_convert_wide_a(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                         const float* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, float* c,
                         std::int64_t ldc);

// rows x cols of bf16 (row stride ld) widened into a dense f32 [rows, cols]: the convert
// path's blocks (and the attention kernel's tiles on that path, attention.cc).
void widen_bf16_block(const bf16* in, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* out);

}  // namespace peakbound::cpu
