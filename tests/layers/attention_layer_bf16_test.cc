// The attention sublayer in bf16 (layers/attention_layer.h, "Mixed precision") against
// the f32 layer on the same values: parameters, x and dy are drawn, rounded to bf16, and
// the f32 layer runs on their widened copies, so the two see exactly the same inputs and
// differ only by bf16's roundings inside the layer. Each stored activation (h, q, k, v,
// o, d_o, dq, dk, dv, dh, y, dx) rounds by up to 2^-9 relative and a path chains about
// five of them, and attention's P / dS tiles round once more (the kernel's bf16 test
// measured 7.8e-3 worst), so y and dx stay within 1e-2 of max|ref| (norm-wise) and every
// fp32 parameter gradient (an fp32 sum of products of rounded factors) keeps cosine
// >= 0.999 and its norm within 1% (with one token the exact d wq, d wk are 0: checked to
// stay noise). Shapes: qk_norm on and off, GQA (6 query heads on
// one KV head), H != Hq D, odd T (37), a single row, B > 1 sequences per call, and
// sequences longer than the bf16 query chunk (kAttentionChunkRows) and nn/linear's row
// tile. Also: the Arena's measured peaks equal attention_layer_footprint in bf16, the
// bf16-only specs are 0 bytes under f32, gradients are added into, and a layer refuses
// tensors of the other precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/attention_layer.h"
#include "peakbound/ops/gemm.h"
#include "tests/layers/attention_layer_harness.h"
#include "tests/layers/layer_checks.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using attention_test::draw;
using attention_test::Result;
using attention_test::Vec;

struct Case {
  std::int64_t T, S, H, Hq, Hkv, D;  // S: seq_len (0: the call is one sequence)
  bool qk_norm;
  std::string str() const {
    return "T=" + std::to_string(T) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
           " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
           " qk_norm=" + std::to_string(qk_norm);
  }
};

AttentionLayerConfig config_of(const Case& c, Precision p) {
  return attention_test::config(c.H, c.Hq, c.Hkv, c.D, c.qk_norm, c.S, p);
}

struct Inputs {
  std::vector<Vec> params;  // AttentionLayer::parameters() order
  Vec x, dy;
};

Inputs draw_inputs(const Case& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in;
  in.params = attention_test::draw_params(config_of(c, Precision::f32), rng);
  in.x = draw(c.T * c.H, rng, 0.0, 1.0);
  in.dy = draw(c.T * c.H, rng, 0.0, 1.0);
  return in;
}

// One forward and `backwards` backward calls of the layer in precision p (peaks checked).
Result run(const Case& c, Precision p, const Inputs& in, int backwards = 1) {
  return attention_test::run_layer(config_of(c, p), in.params, in.x, in.dy, nullptr, backwards);
}

// max|got - ref| / max|ref|
double max_relative(const Vec& got, const Vec& ref) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return scale > 0 ? err / scale : err;
}

using layer_test::cosine;

double norm_ratio(const Vec& a, const Vec& b) {
  double aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return std::sqrt(aa / bb);
}

const char* const kNames[] = {"w_in", "wq", "wk", "wv", "wo", "q_norm", "k_norm"};

TEST(AttentionLayerBf16, MatchesTheF32LayerOnWidenedInputs) {
  double worst_y = 0, worst_dx = 0, worst_cos = 1, worst_norm = 0;
  const std::vector<Case> cases = {
      {37, 0, 40, 4, 2, 16, false},   // odd T, GQA 2:1, H != Hq D
      {37, 0, 40, 4, 2, 16, true},    // the same with qk_norm
      {37, 0, 24, 6, 1, 8, true},     // GQA 6:1
      {1, 0, 20, 2, 2, 8, false},     // a single row
      {111, 37, 40, 4, 2, 16, true},  // B = 3 sequences of 37
      {600, 300, 48, 4, 2, 16, true},  // B = 2 of 300: query chunks 256 + 44, linear tiles 256, 256, 88
      {300, 0, 32, 2, 2, 16, false},  // one sequence over two chunks, MHA
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    const Inputs in = draw_inputs(c, static_cast<std::uint32_t>(7 * c.T + c.H + (c.qk_norm ? 1 : 0)));
    const Result ref = run(c, Precision::f32, in), got = run(c, Precision::bf16, in);
    const double ey = max_relative(got.y, ref.y), edx = max_relative(got.dx, ref.dx);
    EXPECT_LE(ey, 1e-2) << "y";
    EXPECT_LE(edx, 1e-2) << "dx";
    worst_y = std::max(worst_y, ey);
    worst_dx = std::max(worst_dx, edx);
    for (std::size_t i = 0; i < ref.grads.size(); ++i) {
      if (c.T == 1 && (i == 1 || i == 2 || i >= 5)) {
        // One token attends to itself alone: o = v whatever q and k are, so the exact
        // gradients of wq, wk (and the q/k norms) are 0 and both layers hold rounding
        // noise, whose direction means nothing. It must stay noise next to d wv.
        const auto amax = [](const Vec& v) {
          double m = 0;
          for (float e : v) m = std::max(m, double(std::abs(e)));
          return m;
        };
        EXPECT_LE(amax(got.grads[i]), 1e-3 * amax(ref.grads[3])) << "d " << kNames[i] << " (exactly 0)";
        continue;
      }
      const double cs = cosine(got.grads[i], ref.grads[i]), nr = std::abs(norm_ratio(got.grads[i], ref.grads[i]) - 1);
      EXPECT_GE(cs, 0.999) << "d " << kNames[i];
      EXPECT_LE(nr, 1e-2) << "d " << kNames[i] << " norm";
      worst_cos = std::min(worst_cos, cs);
      worst_norm = std::max(worst_norm, nr);
    }
  }
  std::printf("bf16 vs f32 attention layer: worst y %.3g, dx %.3g (of max|ref|); worst dW cosine %.6f, |norm ratio - 1| "
              "%.3g\n",
              worst_y, worst_dx, worst_cos, worst_norm);
}

TEST(AttentionLayerBf16, BackwardAddsIntoGradientsAndRewritesDx) {
  const Case c{37, 0, 40, 4, 2, 16, true};
  const Inputs in = draw_inputs(c, 11);
  const Result once = run(c, Precision::bf16, in, 1), twice = run(c, Precision::bf16, in, 2);
  EXPECT_EQ(once.dx, twice.dx);  // written, bitwise the same
  for (std::size_t i = 0; i < once.grads.size(); ++i)
    for (std::size_t j = 0; j < once.grads[i].size(); ++j)
      ASSERT_NEAR(twice.grads[i][j], 2 * once.grads[i][j], 1e-5 * (1 + std::abs(2 * once.grads[i][j]))) << kNames[i];
}

TEST(AttentionLayerBf16, FootprintsAreTheF32OnesPlusTheBf16Temporaries) {
  for (const Case& c : {Case{37, 0, 40, 4, 2, 16, true}, Case{600, 300, 48, 4, 2, 16, false}, Case{0, 0, 16, 2, 2, 8,
                                                                                                    true}}) {
    SCOPED_TRACE(c.str());
    const AttentionLayerConfig f32 = config_of(c, Precision::f32), b16 = config_of(c, Precision::bf16);
    const AttentionLayerBuffers a = attention_layer_buffers(c.T, f32), b = attention_layer_buffers(c.T, b16);
    // f32: the bf16-only specs hold nothing, and the elem_bytes form is the same.
    for (const BufferSpec& s : {a.tile, a.o32, a.dq32, a.dkv32}) EXPECT_EQ(s.bytes, 0u);
    EXPECT_EQ(attention_layer_buffers(c.T, f32, 4).h.bytes, a.h.bytes);
    for (const char* ph : {"forward project", "forward", "backward output", "backward", "backward project"})
      EXPECT_EQ(attention_layer_footprint(c.T, f32).phase(ph).device_total(),
                attention_layer_footprint(c.T, f32, 4).phase(ph).device_total());
    // bf16: activations at half the bytes; statistics fp32 as in f32.
    EXPECT_EQ(2 * b.h.bytes, a.h.bytes);
    EXPECT_EQ(2 * b.dk.bytes, a.dk.bytes);
    EXPECT_EQ(b.lse.bytes, a.lse.bytes);
    EXPECT_EQ(b.rstd.bytes, a.rstd.bytes);
    if (c.T == 0) {
      for (const BufferSpec& s : {b.tile, b.o32, b.dq32, b.dkv32}) EXPECT_EQ(s.bytes, 0u);
      continue;
    }
    const std::int64_t S = c.S > 0 ? c.S : c.T, R = std::min(S, kAttentionChunkRows), Q = c.Hq * c.D;
    EXPECT_GE(b.o32.bytes, static_cast<std::uint64_t>(R * Q) * 4);  // o32: one query chunk, not the sequence
    EXPECT_LT(b.o32.bytes, static_cast<std::uint64_t>(R * Q) * 4 + 256);
    EXPECT_GE(b.dkv32.bytes, static_cast<std::uint64_t>(S * 2 * c.Hkv * c.D) * 4);
    // Measured == footprint in both precisions is run() for every case above.
    const Inputs in = draw_inputs(c, 5);
    run(c, Precision::bf16, in);
  }
}

// forward_for_backward keeps o and lse (exactly the footprint's "kept" bytes stay live:
// run_layer checks it) and the backward then skips the attention's forward: the same y,
// dx and gradients bit for bit as a backward that recomputes everything, in both
// precisions, with several sequences per call and sequences longer than a query chunk.
// A backward on other rows than the kept ones recomputes (the kept o and lse are not
// theirs), and so does a second backward.
TEST(AttentionLayerBf16, ForwardForBackwardKeepsOAndLseAndChangesNoBit) {
  for (Precision p : {Precision::f32, Precision::bf16})
    for (const Case& c : {Case{37, 0, 24, 6, 1, 8, true}, Case{48, 16, 32, 4, 2, 8, false},
                          Case{300, 300, 32, 4, 2, 16, true}, Case{1, 0, 8, 2, 1, 4, false}}) {
      SCOPED_TRACE(c.str() + " " + std::string(precision_name(p)));
      const Inputs in = draw_inputs(c, static_cast<std::uint32_t>(c.T + c.H));
      const Result plain = attention_test::run_layer(config_of(c, p), in.params, in.x, in.dy, nullptr, 2, false);
      const Result kept = attention_test::run_layer(config_of(c, p), in.params, in.x, in.dy, nullptr, 2, true);
      attention_test::expect_same_bits(kept, plain);
    }
  // Kept for other rows: the backward recomputes for its own x (results as a plain layer's).
  const Case c{20, 0, 16, 4, 2, 8, true};
  const Inputs a = draw_inputs(c, 1), b = draw_inputs(c, 2);
  const AttentionLayerConfig cfg = config_of(c, Precision::f32);
  CpuDevice dev(64ull << 20);
  const attention_test::LayerParams lp = attention_test::upload_params(dev, cfg, a.params);
  AttentionLayer layer(dev, cfg, lp.pt, lp.gt);
  const Shape s{c.T, c.H};
  Buffer xa = attention_test::upload(dev, Component::workspace, a.x, DType::f32);
  Buffer xb = attention_test::upload(dev, Component::workspace, b.x, DType::f32);
  Buffer dy = attention_test::upload(dev, Component::workspace, b.dy, DType::f32);
  Buffer y = attention_test::upload(dev, Component::workspace, a.x, DType::f32);
  Buffer dx = attention_test::upload(dev, Component::workspace, a.x, DType::f32);
  layer.forward_for_backward(xa.tensor(s, DType::f32), y.tensor(s, DType::f32));
  layer.backward(xb.tensor(s, DType::f32), dy.tensor(s, DType::f32), dx.tensor(s, DType::f32));
  EXPECT_EQ(dev.arena().live(Component::attention), 0u);
  const Vec got = attention_test::download(dx, b.x.size(), DType::f32);
  Inputs on_b = a;
  on_b.x = b.x;
  on_b.dy = b.dy;
  EXPECT_EQ(got, run(c, Precision::f32, on_b).dx);
}

// The four variants the in-place and by-rows tests run: 0 whole calls; 1 the queries in
// pieces; 2 gpt-oss (biases, sinks, a window; in pieces); 3 MLA with q_lora_rank (whole calls).
AttentionLayerConfig variant_config(const Case& c, Precision p, int variant) {
  AttentionLayerConfig cfg = config_of(c, p);
  if (variant == 1) cfg.piece_tokens = 5;
  if (variant == 2) {
    cfg.qk_norm = false;
    cfg.qkv_bias = cfg.out_bias = cfg.sinks = true;
    cfg.window = 6;
    cfg.piece_tokens = 7;
  }
  if (variant == 3) {
    cfg.mla = true;
    cfg.qk_norm = false;
    cfg.kv_heads = cfg.q_heads;
    cfg.q_lora_rank = 6;
    cfg.kv_lora_rank = 5;
    cfg.qk_nope_dim = 4;
    cfg.qk_rope_dim = 4;
    cfg.v_dim = 3;
  }
  return cfg;
}

// The forward in place (y over x, what a checkpointed stack's one-slot ring runs): the
// same bits as into a buffer of its own, whole calls and queries in pieces, GQA with
// gpt-oss's biases, sinks and window, and MLA; f32 and bf16.
TEST(AttentionLayerBf16, ForwardInPlaceIsBitwiseTheSame) {
  int n = 0;
  for (Precision p : {Precision::f32, Precision::bf16})
    for (const Case& c : {Case{37, 0, 24, 6, 1, 8, true}, Case{48, 16, 32, 4, 2, 8, false},
                          Case{1, 0, 8, 2, 1, 4, false}, Case{0, 0, 8, 2, 1, 4, false}})
      for (int variant = 0; variant < 4; ++variant) {
        const AttentionLayerConfig cfg = variant_config(c, p, variant);
        SCOPED_TRACE(c.str() + " variant " + std::to_string(variant) + " " + std::string(precision_name(p)));
        std::mt19937 rng(static_cast<std::uint32_t>(c.T * 7 + variant));
        const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
        const Vec x = draw(c.T * c.H, rng, 0.0, 1.0), dy = draw(c.T * c.H, rng, 0.0, 1.0);
        const Result apart = attention_test::run_layer(cfg, params, x, dy);
        const Result over = attention_test::run_layer(cfg, params, x, dy, nullptr, 1, false, /*in_place=*/true);
        attention_test::expect_same_bits(over, apart);
        ++n;
      }
  EXPECT_EQ(n, 32);
}

// The kernel's shares on threads (AttentionLayerConfig::threads: ModelSchedules::
// attention_threads, the rank's cores in a CPU run): the same bits as one share, the
// Arena's peaks the footprint's with a workspace slot a share (run_layer checks them), and
// the BLAS's thread count back where it was after the calls (the ops run the kernel on
// their own pool with the BLAS on one thread meanwhile). GQA whole and in query pieces,
// gpt-oss's sinks and window, MLA, and MLA's latent ring on one rank (pieces of 5 tokens: the
// ring's kernel calls take the shares too); 130 tokens: two query blocks of 128.
TEST(AttentionLayerBf16, KernelSharesOnThreadsAreBitwiseTheSame) {
  const int blas_before = ops::blas_num_threads();
  ops::set_blas_threads(2);
  int n = 0;
  for (Precision p : {Precision::f32, Precision::bf16})
    for (const Case& c : {Case{37, 0, 24, 6, 1, 8, true}, Case{130, 0, 32, 4, 2, 8, false}})
      for (int variant = 0; variant < 5; ++variant)
        for (int threads : {2, 3}) {
          AttentionLayerConfig cfg = variant_config(c, p, std::min(variant, 3));
          if (variant == 4) cfg.piece_tokens = 5;  // MLA's latent ring at cp 1
          SCOPED_TRACE(c.str() + " variant " + std::to_string(variant) + " " + std::string(precision_name(p)) +
                       " threads " + std::to_string(threads));
          std::mt19937 rng(static_cast<std::uint32_t>(c.T * 11 + variant));
          const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
          const Vec x = draw(c.T * c.H, rng, 0.0, 1.0), dy = draw(c.T * c.H, rng, 0.0, 1.0);
          const Result one = attention_test::run_layer(cfg, params, x, dy);
          const std::uint64_t elem = p == Precision::bf16 ? 2 : 4;
          const std::uint64_t one_slot = attention_layer_footprint(c.T, cfg, elem).device_peak(Component::attention);
          cfg.threads = threads;
          const Result shared = attention_test::run_layer(cfg, params, x, dy);
          attention_test::expect_same_bits(shared, one);
          EXPECT_EQ(ops::blas_num_threads(), 2);
          EXPECT_GT(attention_layer_footprint(c.T, cfg, elem).device_peak(Component::attention), one_slot);
          ++n;
        }
  EXPECT_EQ(n, 40);
  ops::set_blas_threads(blas_before);
  AttentionLayerConfig bad = config_of(Case{8, 0, 8, 2, 1, 4, false}, Precision::f32);
  bad.threads = 0;
  try {
    check_attention_layer_config(bad);
    ADD_FAILURE() << "threads 0 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "attention layer: threads must be >= 1 (got 0)");
  }
}

// The output by rows (forward_for_rows, then forward_rows over tiles of output_rows: a
// decoder layer's backward feeding its MLP's row tiles) has the bits of the forward's y
// (forward_for_backward, over the same tiles), and the backward after it its dx and
// gradients, for the same variants as above; rows out of range, not whole tiles, or
// without forward_for_rows on that x, are refused.
TEST(AttentionLayerBf16, ForwardByRowsIsBitwiseTheSame) {
  int n = 0;
  for (Precision p : {Precision::f32, Precision::bf16})
    for (const Case& c : {Case{37, 0, 24, 6, 1, 8, true}, Case{48, 16, 32, 4, 2, 8, false},
                          Case{1, 0, 8, 2, 1, 4, false}, Case{0, 0, 8, 2, 1, 4, false}})
      for (int variant = 0; variant < 4; ++variant)
        for (std::int64_t rows : {1, 6, 1024}) {
          AttentionLayerConfig cfg = variant_config(c, p, variant);
          cfg.output_rows = rows;  // as a decoder layer sets it to its MLP's row tile
          SCOPED_TRACE(c.str() + " variant " + std::to_string(variant) + " rows " + std::to_string(rows) + " " +
                       std::string(precision_name(p)));
          std::mt19937 rng(static_cast<std::uint32_t>(c.T * 11 + variant));
          const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
          const Vec x = draw(c.T * c.H, rng, 0.0, 1.0), dy = draw(c.T * c.H, rng, 0.0, 1.0);
          const Result whole = attention_test::run_layer(cfg, params, x, dy, nullptr, 1, /*keep=*/true);
          const Result by_rows = attention_test::run_layer(cfg, params, x, dy, nullptr, 1, false, false, rows);
          attention_test::expect_same_bits(by_rows, whole);
          ++n;
        }
  EXPECT_EQ(n, 96);

  const Case c{5, 0, 8, 2, 1, 4, false};
  AttentionLayerConfig cfg = config_of(c, Precision::f32);
  cfg.output_rows = 2;
  std::mt19937 rng(1);
  const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
  CpuDevice dev(16 << 20);
  const attention_test::LayerParams lp = attention_test::upload_params(dev, cfg, params);
  AttentionLayer layer(dev, cfg, lp.pt, lp.gt);
  const Shape s{c.T, c.H};
  Buffer xb = attention_test::upload(dev, Component::workspace, draw(c.T * c.H, rng, 0.0, 1.0), DType::f32);
  Buffer other = attention_test::upload(dev, Component::workspace, draw(c.T * c.H, rng, 0.0, 1.0), DType::f32);
  Buffer yb = attention_test::upload(dev, Component::workspace, Vec(c.T * c.H, 0.0f), DType::f32);
  EXPECT_THROW(layer.forward_rows(xb.tensor(s, DType::f32), 0, 1, yb.data()), InvalidArgument);  // nothing kept
  layer.forward_for_rows(xb.tensor(s, DType::f32));
  EXPECT_THROW(layer.forward_rows(other.tensor(s, DType::f32), 0, 1, yb.data()), InvalidArgument);  // another x
  EXPECT_THROW(layer.forward_rows(xb.tensor(s, DType::f32), 3, 3, yb.data()), InvalidArgument);     // past T
  EXPECT_THROW(layer.forward_rows(xb.tensor(s, DType::f32), -1, 1, yb.data()), InvalidArgument);
  EXPECT_THROW(layer.forward_rows(xb.tensor(s, DType::f32), 1, 2, yb.data()), InvalidArgument);  // not a tile
  EXPECT_THROW(layer.forward_rows(xb.tensor(s, DType::f32), 0, 3, yb.data()), InvalidArgument);  // 1.5 tiles
  layer.forward_rows(xb.tensor(s, DType::f32), 2, 3, yb.data());  // two tiles, the last short
  cfg.output_rows = -1;
  EXPECT_THROW(AttentionLayer(dev, cfg, lp.pt, lp.gt), InvalidArgument);
}

// o on the host (output_on_host, what the trainer's one-slot ring sets): the forward, in
// place or not, forward_for_backward and its backward, and the by-rows forward with the
// backward after it give the bits of o on the device; run_layer checks every call's
// measured peak against the footprint (no whole o on the device but o_proj's backward's)
// and the host area's size. Queries in pieces (variants 1, 2: GQA, gpt-oss's biases, sinks
// and window); whole calls and MLA (variants 0, 3) keep o on the device whatever the flag.
TEST(AttentionLayerBf16, OutputOnTheHostIsBitwiseTheSame) {
  int n = 0, on_host = 0;
  for (Precision p : {Precision::f32, Precision::bf16})
    for (const Case& c : {Case{37, 0, 24, 6, 1, 8, true}, Case{48, 16, 32, 4, 2, 8, false}})
      for (int variant = 0; variant < 4; ++variant)
        for (int mode = 0; mode < 5; ++mode) {
          AttentionLayerConfig cfg = variant_config(c, p, variant);
          cfg.output_rows = mode == 4 ? 0 : 6;  // 0: o_proj reads the whole o back in one tile
          const bool keep = mode == 1, in_place = mode == 2;
          const std::int64_t rows = mode == 3 ? 6 : 0;
          SCOPED_TRACE(c.str() + " variant " + std::to_string(variant) + " mode " + std::to_string(mode) + " " +
                       std::string(precision_name(p)));
          std::mt19937 rng(static_cast<std::uint32_t>(c.T * 13 + variant));
          const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
          const Vec x = draw(c.T * c.H, rng, 0.0, 1.0), dy = draw(c.T * c.H, rng, 0.0, 1.0);
          const Result device = attention_test::run_layer(cfg, params, x, dy, nullptr, 2, keep, in_place, rows);
          cfg.output_on_host = true;
          on_host += attention_output_on_host(c.T, cfg) ? 1 : 0;
          const Result host = attention_test::run_layer(cfg, params, x, dy, nullptr, 2, keep, in_place, rows);
          attention_test::expect_same_bits(host, device);
          ++n;
        }
  EXPECT_EQ(n, 80);
  EXPECT_EQ(on_host, 40);  // variants 1 and 2 take their queries in pieces

  // No area, or keep-through (every layer's o kept would share it): refused.
  const Case c{12, 0, 8, 2, 1, 4, false};
  AttentionLayerConfig cfg = variant_config(c, Precision::f32, 1);
  cfg.output_on_host = true;
  std::mt19937 rng(2);
  const std::vector<Vec> params = attention_test::draw_params(cfg, rng);
  CpuDevice dev(16 << 20);
  const attention_test::LayerParams lp = attention_test::upload_params(dev, cfg, params);
  AttentionLayer layer(dev, cfg, lp.pt, lp.gt);
  const Shape s{c.T, c.H};
  Buffer xb = attention_test::upload(dev, Component::workspace, draw(c.T * c.H, rng, 0.0, 1.0), DType::f32);
  Buffer yb = attention_test::upload(dev, Component::workspace, Vec(c.T * c.H, 0.0f), DType::f32);
  try {
    layer.forward(xb.tensor(s, DType::f32), yb.tensor(s, DType::f32));
    ADD_FAILURE() << "a forward with its output on the host ran without a host area";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "attention layer: output_on_host needs set_output_host's area before a call");
  }
  EXPECT_THROW(layer.set_keep_through(true), InvalidArgument);
  EXPECT_EQ(dev.arena().live(Component::attention), 0u);  // the refused call left nothing behind
}

TEST(AttentionLayerBf16, RefusesTensorsOfTheOtherPrecision) {
  const Case c{3, 0, 16, 2, 2, 8, false};
  CpuDevice dev(16 << 20);
  const std::vector<Shape> shapes = attention_test::param_shapes(config_of(c, Precision::bf16));
  std::vector<Buffer> bufs;
  AttentionLayerTensors p16, p32, g32;
  std::vector<Tensor*> a = {&p16.w_in, &p16.wq, &p16.wk, &p16.wv, &p16.wo};
  std::vector<Tensor*> b = {&p32.w_in, &p32.wq, &p32.wk, &p32.wv, &p32.wo};
  std::vector<Tensor*> g = {&g32.w_in, &g32.wq, &g32.wk, &g32.wv, &g32.wo};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    bufs.push_back(dev.allocate(Component::params, static_cast<std::uint64_t>(shapes[i].numel()) * 4));
    *a[i] = bufs.back().tensor(shapes[i], DType::bf16);
    *b[i] = *g[i] = bufs.back().tensor(shapes[i], DType::f32);
  }
  try {
    AttentionLayer(dev, config_of(c, Precision::bf16), p32, g32);
    ADD_FAILURE() << "a bf16 layer took f32 parameters";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "attention layer: parameter w_in is [16] f32, want [16] bf16");
  }
  EXPECT_THROW(AttentionLayer(dev, config_of(c, Precision::bf16), p16, p16), InvalidArgument);  // bf16 grads
  EXPECT_THROW(AttentionLayer(dev, config_of(c, Precision::f32), p16, g32), InvalidArgument);
  AttentionLayer layer(dev, config_of(c, Precision::bf16), p16, g32);
  Buffer x = dev.allocate(Component::workspace, 3 * 16 * 4), y = dev.allocate(Component::workspace, 3 * 16 * 4);
  EXPECT_ANY_THROW(layer.forward(x.tensor(Shape{3, 16}, DType::f32), y.tensor(Shape{3, 16}, DType::f32)));
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
