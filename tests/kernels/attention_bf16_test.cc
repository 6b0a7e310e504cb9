// The bf16 form of the CPU attention (kernels/cpu/attention.h, "Mixed precision")
// against the f32 kernel on the same inputs widened (and the naive double attention on
// them), on both bf16 GEMM paths (native where the CPU has AVX512-BF16, convert always):
// odd shapes, GQA, D != Dv, windows, blocks at offsets folded with accumulate; workspace
// sizes, threads, row_dot.
//
// Tolerance: relative error max|a - ref| / max|ref| (cpu::relative_error) <= 1e-2 for
// every output (the worst case is printed). The bf16 kernel rounds P (for O += P V,
// dV += P^T dO) and dS (for dK, dQ) to bf16 once per element, at most 2^-8 = 3.9e-3
// relative each, and the backward reads the forward's out rounded to bf16 (the saved
// activation), which moves D_i = rowsum(dout * out) by as much, and dS = P (dP - D_i)
// with it where dP - D_i cancels.
// The errors of independent elements add in sums of random signs, so they stay near
// 2^-8 of the output's scale: the worst seen is 7.8e-3 (dq at T = 7, where a few keys
// make dq a cancelling sum of dS terms, sum_j dS_ij = 0), 3.2e-3 at T = 65; a 2% wrong
// scale gives 2.7e-2 and a key block left out of a fold 0.34 (both checked below).
// The same bound holds against the naive double attention (attention_naive.h), which
// the f32 kernel matches within 1e-5 (attention_test.cc).
// The inputs (q, k, v, dout) are bf16 values in both runs, so input rounding is not part
// of the error. D_i (attention_row_dot) widens exactly and sums in double as the f32
// form: bitwise the f32 result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/attention.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "tests/kernels/attention_naive.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using Vec = std::vector<float>;
using Bvec = std::vector<bf16>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTol = 1e-2;
constexpr double kZero = 1e-5;  // |x| below this in a gradient whose terms are O(1): zero up to fp32 noise

std::vector<Bf16GemmPath> paths() {
  std::vector<Bf16GemmPath> p{Bf16GemmPath::convert};
  if (bf16_gemm_path_supported(Bf16GemmPath::native)) p.push_back(Bf16GemmPath::native);
  return p;
}

// n values in [lo, hi], rounded to bf16: the bf16 tensor and its exact f32 widening.
struct Tensor16 {
  Bvec h;
  Vec f;
};
Tensor16 random_bf16(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor16 t{Bvec(n), Vec(n)};
  for (std::size_t i = 0; i < n; ++i) {
    t.h[i] = ::peakbound::to_bf16(d(rng));
    t.f[i] = ::peakbound::to_f32(t.h[i]);
  }
  return t;
}

Bvec narrowed(const Vec& x) {
  Bvec h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = ::peakbound::to_bf16(x[i]);
  return h;
}

struct Inputs {
  Tensor16 q, k, v, dout;
};

Inputs make_inputs(const AttentionDims& a, std::mt19937& rng) {
  const auto T = static_cast<std::size_t>(a.tokens), Tk = static_cast<std::size_t>(a.key_tokens());
  // |q|, |k| up to 2, as attention_test.cc: scores of a few units, a peaked softmax.
  return {random_bf16(T * a.q_heads * a.qk_dim, rng, -2.0f, 2.0f),
          random_bf16(Tk * a.kv_heads * a.qk_dim, rng, -2.0f, 2.0f),
          random_bf16(Tk * a.kv_heads * a.v_dim, rng, -1.0f, 1.0f),
          random_bf16(T * a.q_heads * a.v_dim, rng, -1.0f, 1.0f)};
}

struct Result {
  Vec out, lse, dq, dk, dv;
};

Result empty_result(const AttentionDims& a, float fill) {
  const std::int64_t T = a.tokens, Tk = a.key_tokens();
  return {Vec(T * a.q_heads * a.v_dim, fill), Vec(T * a.q_heads, fill), Vec(T * a.q_heads * a.qk_dim, fill),
          Vec(Tk * a.kv_heads * a.qk_dim, fill), Vec(Tk * a.kv_heads * a.v_dim, fill)};
}

// The naive double attention (attention_naive.h) on the widened inputs.
Result run_naive(const AttentionDims& a, const Inputs& in) {
  testing::NaiveAttention r = testing::naive_attention(a, in.q.f, in.k.f, in.v.f, in.dout.f);
  return {std::move(r.out), std::move(r.lse), std::move(r.dq), std::move(r.dk), std::move(r.dv)};
}

// The f32 kernel on the widened inputs (its own fp32 out into its backward).
Result run_f32(const AttentionDims& a, const Inputs& in) {
  Result r = empty_result(a, kNaN);
  Vec ws(attention_workspace_floats(a), kNaN);
  attention_forward(r.out.data(), r.lse.data(), in.q.f.data(), in.k.f.data(), in.v.f.data(), a, ws.data());
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.f.data(), in.q.f.data(), in.k.f.data(),
                     in.v.f.data(), r.out.data(), r.lse.data(), a, ws.data());
  return r;
}

// The bf16 kernel as a layer runs it: forward, out narrowed once to the saved bf16
// activation, backward from it. NaN-filled outputs and workspace (a read of an unwritten
// value shows) and a guard past the bf16 workspace size that must stay untouched.
Result run_bf16(const AttentionDims& a, const Inputs& in, Bf16GemmPath path, ThreadPool* pool = nullptr) {
  Result r = empty_result(a, kNaN);
  const std::int64_t guard = 64, fw = attention_forward_workspace_floats(a, DType::bf16),
                     bw = attention_backward_workspace_floats(a, false, DType::bf16);
  EXPECT_EQ(attention_workspace_floats(a, DType::bf16), std::max(fw, bw));
  Vec ws(std::max(fw, bw) + guard, kNaN);
  for (std::int64_t i = 0; i < guard; ++i) ws[fw + i] = 1234.5f;
  attention_forward(r.out.data(), r.lse.data(), in.q.h.data(), in.k.h.data(), in.v.h.data(), a, ws.data(), path, pool);
  for (std::int64_t i = 0; i < guard; ++i) EXPECT_EQ(ws[fw + i], 1234.5f) << "forward wrote past its workspace";
  const Bvec saved = narrowed(r.out);
  std::fill(ws.begin(), ws.end(), kNaN);
  for (std::int64_t i = 0; i < guard; ++i) ws[bw + i] = 1234.5f;
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.h.data(), in.q.h.data(), in.k.h.data(),
                     in.v.h.data(), saved.data(), r.lse.data(), a, ws.data(), path, pool);
  for (std::int64_t i = 0; i < guard; ++i) EXPECT_EQ(ws[bw + i], 1234.5f) << "backward wrote past its workspace";
  return r;
}

double rel(const Vec& got, const Vec& want) {
  return relative_error(got.data(), want.data(), static_cast<std::int64_t>(got.size()));
}

// The worst relative error over the five outputs (lse: -inf rows must match exactly).
double worst_error(const Result& got, const Result& want, std::string* field = nullptr) {
  const std::pair<const char*, std::pair<const Vec*, const Vec*>> fields[] = {
      {"out", {&got.out, &want.out}}, {"lse", {&got.lse, &want.lse}}, {"dq", {&got.dq, &want.dq}},
      {"dk", {&got.dk, &want.dk}},    {"dv", {&got.dv, &want.dv}}};
  double worst = 0;
  for (const auto& [name, pair] : fields) {
    Vec a = *pair.first, b = *pair.second;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::isinf(a[i]) && a[i] == b[i]) a[i] = b[i] = 0.0f;  // both -inf: a row that saw no key
    double ref_max = 0, got_max = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ref_max = std::max(ref_max, std::fabs(static_cast<double>(b[i])));
      got_max = std::max(got_max, std::fabs(static_cast<double>(a[i])));
    }
    // A gradient that is zero in exact arithmetic (T = 1: the softmax over one key is
    // constant, so dq = dk = 0) is fp32 cancellation noise in both, and a ratio of two
    // noises means nothing: then both must be that small (1 when the other is not).
    const double e = ref_max <= kZero ? (got_max <= kZero ? 0.0 : 1.0) : rel(a, b);
    if (!(e <= worst)) {
      worst = e;
      if (field != nullptr) *field = name;
    }
  }
  return worst;
}

std::string name(const AttentionDims& a, Bf16GemmPath p) {
  return "T=" + std::to_string(a.tokens) + " Tk=" + std::to_string(a.key_tokens()) +
         " Hq=" + std::to_string(a.q_heads) + " Hkv=" + std::to_string(a.kv_heads) + " D=" + std::to_string(a.qk_dim) +
         " Dv=" + std::to_string(a.v_dim) +
         " W=" + std::to_string(a.window) + " Bq=" + std::to_string(a.block_q) + " Bk=" + std::to_string(a.block_k) +
         " qo=" + std::to_string(a.q_offset) + " ko=" + std::to_string(a.k_offset) + " " +
         std::string(bf16_gemm_path_name(p));
}

TEST(AttentionBf16, MatchesTheF32KernelAndTheDoubleReferenceOnWidenedInputs) {
  std::mt19937 rng(28);
  double worst = 0, worst_naive = 0;
  std::string worst_case;
  int cases = 0;
  for (Bf16GemmPath path : paths())
    for (std::int64_t T : {1, 7, 65, 130})
      for (auto [hq, hkv] : {std::pair{1, 1}, std::pair{4, 1}, std::pair{8, 2}})
        for (auto [d, dv] : {std::pair{13, 24}, std::pair{64, 64}})
          for (auto [bq, bk] : {std::pair{7, 5}, std::pair{64, 64}})
            for (std::int64_t W : {0, 9}) {
              AttentionDims a;
              a.tokens = T, a.q_heads = hq, a.kv_heads = hkv, a.qk_dim = d, a.v_dim = dv;
              a.block_q = bq, a.block_k = bk, a.window = W;
              const Inputs in = make_inputs(a, rng);
              const Result got = run_bf16(a, in, path);
              std::string field, field_naive;
              const double e = worst_error(got, run_f32(a, in), &field);
              const double e_naive = worst_error(got, run_naive(a, in), &field_naive);
              EXPECT_LE(e, kTol) << field << " " << name(a, path) << " against the f32 kernel";
              EXPECT_LE(e_naive, kTol) << field_naive << " " << name(a, path) << " against the double reference";
              if (e > worst) worst_case = field + " " + name(a, path);
              worst = std::max(worst, e);
              worst_naive = std::max(worst_naive, e_naive);
              ++cases;
            }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("bf16 attention vs f32 kernel: %d cases, worst relative error %.3g (%s); vs naive double %.3g\n",
              cases, worst, worst_case.c_str(), worst_naive);
}

// The error measure sees the mistakes it is there for: a score scale 2% off lands above
// the tolerance, a key block left out of the fold (next test) far above it.
TEST(AttentionBf16, AWrongScaleFailsTheTolerance) {
  std::mt19937 rng(5);
  for (Bf16GemmPath path : paths()) {
    AttentionDims a;
    a.tokens = 65, a.q_heads = 8, a.kv_heads = 2, a.qk_dim = 64, a.v_dim = 48, a.block_q = 16, a.block_k = 16;
    const Inputs in = make_inputs(a, rng);
    const Result want = run_f32(a, in);
    AttentionDims off = a;
    off.scale = a.effective_scale() * 1.02f;
    const double right = worst_error(run_bf16(a, in, path), want), wrong = worst_error(run_bf16(off, in, path), want);
    EXPECT_LE(right, kTol) << name(a, path);
    EXPECT_GT(wrong, kTol) << name(a, path);
    std::printf("bf16 attention (%s): right scale %.3g, scale 2%% off %.3g\n",
                std::string(bf16_gemm_path_name(path)).c_str(), right, wrong);
  }
}

// A query block of a longer sequence folds its key chunks one call each, out of order
// (accumulate: fp32 running out and lse, fp32 dq, dk, dv added into), with bf16 inputs;
// the result is the f32 kernel's whole-sequence attention of those queries on the
// widened inputs. Leaving one chunk out of both passes fails the tolerance.
TEST(AttentionBf16, AccumulatedKeyChunksMatchTheWholeSequence) {
  std::mt19937 rng(13);
  const std::int64_t S = 61;
  double worst = 0, worst_missing = kInf;
  for (Bf16GemmPath path : paths())
    for (std::int64_t W : {0, 9})
      for (auto [hq, hkv, d, dv] : {std::tuple{4, 1, 13, 9}, std::tuple{8, 2, 16, 24}})
        for (bool given_row_dot : {false, true})
          for (auto [q0, q1] : {std::pair{0, 61}, std::pair{20, 45}, std::pair{50, 61}})
            for (bool drop : {false, true}) {
              AttentionDims whole;
              whole.tokens = q1 - q0, whole.kv_tokens = S, whole.q_offset = q0;
              whole.q_heads = hq, whole.kv_heads = hkv, whole.qk_dim = d, whole.v_dim = dv, whole.window = W;
              whole.block_q = 6, whole.block_k = 5;
              const Inputs in = make_inputs(whole, rng);
              const Result want = run_f32(whole, in);
              // Chunks [0, 7) [7, 20) [20, 21) [21, 44) [44, 61), visited out of order; with
              // drop, [21, 44) is left out (every query case sees some of it).
              std::vector<std::pair<std::int64_t, std::int64_t>> chunks = {
                  {21, 44}, {0, 7}, {44, 61}, {20, 21}, {7, 20}};
              if (drop) chunks.erase(chunks.begin());
              const std::int64_t T = whole.tokens;
              Result got = empty_result(whole, 0.0f);
              std::fill(got.out.begin(), got.out.end(), kNaN);
              std::fill(got.lse.begin(), got.lse.end(), -kInf);
              AttentionDims a = whole;
              a.accumulate = true;
              Vec ws(attention_workspace_floats(a, DType::bf16), kNaN), row_dot(T * hq, kNaN);
              for (auto [c0, c1] : chunks) {
                a.kv_tokens = c1 - c0, a.k_offset = c0;
                attention_forward(got.out.data(), got.lse.data(), in.q.h.data(), in.k.h.data() + c0 * hkv * d,
                                  in.v.h.data() + c0 * hkv * dv, a, ws.data(), path);
              }
              const Bvec saved = narrowed(got.out);
              if (given_row_dot) attention_row_dot(row_dot.data(), in.dout.h.data(), saved.data(), a);
              for (auto [c0, c1] : chunks) {
                a.kv_tokens = c1 - c0, a.k_offset = c0;
                attention_backward(got.dq.data(), got.dk.data() + c0 * hkv * d, got.dv.data() + c0 * hkv * dv,
                                   in.dout.h.data(), in.q.h.data(), in.k.h.data() + c0 * hkv * d,
                                   in.v.h.data() + c0 * hkv * dv, saved.data(), got.lse.data(), a, ws.data(), path,
                                   nullptr, given_row_dot ? row_dot.data() : nullptr);
              }
              std::string field;
              const double e = worst_error(got, want, &field);
              const std::string what = field + " " + name(whole, path) + (given_row_dot ? " row_dot given" : "");
              if (drop) {
                EXPECT_GT(e, 2 * kTol) << "a missing key block passed: " << what;
                worst_missing = std::min(worst_missing, e);
              } else {
                EXPECT_LE(e, kTol) << what;
                worst = std::max(worst, e);
              }
            }
  std::printf("bf16 attention folded over key chunks: worst relative error %.3g; one chunk missing: at least %.3g\n",
              worst, worst_missing);
}

// D_i from bf16 dout and out widens them exactly and sums in double as the f32 form:
// bitwise the f32 row_dot on the widened tensors (odd Dv, a single row).
TEST(AttentionBf16, RowDotIsBitwiseTheF32OnWidenedInputs) {
  std::mt19937 rng(3);
  for (auto [T, hq, dv] : {std::tuple{1, 1, 1}, std::tuple{9, 4, 13}, std::tuple{33, 8, 64}}) {
    AttentionDims a;
    a.tokens = T, a.q_heads = hq, a.kv_heads = 1, a.qk_dim = 8, a.v_dim = dv;
    const auto n = static_cast<std::size_t>(T * hq * dv);
    const Tensor16 dout = random_bf16(n, rng, -3.0f, 3.0f), out = random_bf16(n, rng, -1.0f, 1.0f);
    Vec got(static_cast<std::size_t>(T * hq), kNaN), want(got.size(), kNaN);
    attention_row_dot(got.data(), dout.h.data(), out.h.data(), a);
    attention_row_dot(want.data(), dout.f.data(), out.f.data(), a);
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(float_bits(got[i]), float_bits(want[i])) << i;
  }
}

// The bits do not depend on the thread count (each output element has one owner task),
// as in the f32 form.
TEST(AttentionBf16, DeterministicAcrossThreadCounts) {
  std::mt19937 rng(11);
  AttentionDims a;
  a.tokens = 70, a.q_heads = 8, a.kv_heads = 4, a.qk_dim = 24, a.v_dim = 16, a.block_q = 16, a.block_k = 8;
  a.window = 20;
  const Inputs in = make_inputs(a, rng);
  for (Bf16GemmPath path : paths()) {
    const Result one = run_bf16(a, in, path);
    ThreadPool pool(3);
    AttentionDims b = a;
    b.threads = 3;
    const Result three = run_bf16(b, in, path, &pool);
    EXPECT_EQ(testing::first_differing_output(one, three), "") << bf16_gemm_path_name(path);
  }
}

// The convert path widens each tile operand once and runs the sgemm calls its GEMM would,
// the score products as NN on K and V widened transposed (attention.cc, Wide), while tiles
// or heads over 512 take the generic route (a tile product at a time through gemm_bf16).
// One tile either way (T below both block sizes, so the tiles have the same shapes): the
// same bits, forward and backward, with and without a window. The tile is 45 x 45, a shape
// at which OpenBLAS 0.3.21's NT and NN kernels sum alike (on some tiles cut short they
// treat the edges differently and the routes may differ in the last bit: attention.cc,
// Wide).
TEST(AttentionBf16, ConvertWidensEachOperandOnceWithTheSameBits) {
  std::mt19937 rng(23);
  for (std::int64_t window : {0, 9}) {
    AttentionDims a;
    a.tokens = 45, a.q_heads = 4, a.kv_heads = 2, a.qk_dim = 20, a.v_dim = 12, a.window = window;
    const Inputs in = make_inputs(a, rng);
    AttentionDims once = a, generic = a;
    once.block_q = once.block_k = 64;
    generic.block_q = generic.block_k = 600;  // past 512: the generic route
    const Result x = run_bf16(once, in, Bf16GemmPath::convert), y = run_bf16(generic, in, Bf16GemmPath::convert);
    EXPECT_EQ(testing::first_differing_output(x, y), "") << "window " << window;
    EXPECT_LT(worst_error(x, run_f32(a, in)), kTol);  // and it is attention
  }
}

TEST(AttentionBf16, WorkspaceSizesTakeTheDtype) {
  AttentionDims a;
  a.tokens = 10, a.q_heads = 4, a.kv_heads = 2, a.qk_dim = 8, a.v_dim = 8, a.block_q = 3, a.block_k = 5, a.threads = 2;
  // A bf16 [3, 5] tile: 15 halves in 8 floats; the backward has two of them a slot.
  EXPECT_EQ(attention_forward_workspace_floats(a, DType::bf16), attention_forward_workspace_floats(a) + 2 * 8);
  EXPECT_EQ(attention_backward_workspace_floats(a, true, DType::bf16),
            attention_backward_workspace_floats(a, true) + 2 * 2 * 8);
  EXPECT_EQ(attention_forward_workspace_floats(a, DType::f32), attention_forward_workspace_floats(a));
  EXPECT_THROW(attention_forward_workspace_floats(a, DType::i32), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
