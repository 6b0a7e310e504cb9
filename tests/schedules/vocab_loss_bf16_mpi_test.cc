// The vocabulary loss in bf16 (VocabLossOptions::precision), at whatever group size the
// binary was launched with (1 without mpirun; 2, 3, 4 under ctest):
//   - every implementation (materialized; Ring-DTP auto, activations, weights; and
//     through forward_backward, the fused form at P = 1) against the f32 materialized
//     loss run on the same inputs widened (hidden and W rounded to bf16 first);
//   - each Ring-DTP form against the bf16 materialized loss;
//   - the measured Arena peaks against the bf16 footprints, phase by phase;
// on odd shapes: V not divisible by P and V < P, odd T, chunks that divide nothing,
// uneven counts, ranks without tokens, ignored targets, z-loss, more than one 256-row
// gradient tile.
//
// Tolerances, and why:
//   loss <= 1e-5 relative: the logits are fp32 sums of exact products of bf16 values
//     (gemm_bf16), as in the f32 run on the widened inputs; only the GEMM's summation
//     order differs (~1e-7).
//   d_hidden <= 1e-2 of max|ref|: the gradient G is narrowed to bf16 (up to 2^-9
//     relative per element) before dH = G16 W, and dH is narrowed once more: about two
//     roundings of 2^-9 (1.95e-3) each.
//   dW cosine >= 0.9999 against f32 (>= 0.999 between bf16 forms): dW = G16^T H sums
//     products whose G factor carries an independent rounding of <= 2^-9 each, so the
//     error is a few 1e-3 of each term and far smaller in direction.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/verify/relative_error.h"
#include "peakbound/verify/vocab_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

// One rank's result: the group's loss and count, this rank's d_hidden and dW shard.
struct Result {
  double loss = 0;
  std::int64_t count = 0;
  std::vector<float> dh, dw;
};

template <class A>
A narrow_to(float x) {
  if constexpr (std::is_same_v<A, bf16>)
    return to_bf16(x);
  else
    return to_f32(to_bf16(x));  // the widened input
}

template <class A>
std::vector<A> narrowed(const float* x, std::int64_t n) {
  std::vector<A> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = narrow_to<A>(x[i]);
  return out;
}

// Runs `impl` (precision A) on this rank's slice of p, inputs rounded to bf16 (widened
// back under f32). step: through forward_backward. dW starts at 0.125 and the start is
// taken off (a form that writes instead of adding fails). `between` runs after forward.
template <class A>
Result run(VocabLoss& impl, Communicator& g, const VocabProblem& p, float scale, bool step,
           const std::function<void()>& between = {}) {
  const int r = g.rank();
  const std::int64_t H = p.spec.hidden, T = p.spec.tokens[static_cast<std::size_t>(r)], off = p.offset(r);
  const VocabShard sh = vocab_shard(p.spec.vocab, g.size(), r);
  Device& dev = impl.device();
  const std::vector<A> h = narrowed<A>(p.hidden.data() + off * H, T * H);
  const std::vector<A> w = narrowed<A>(p.weight.data() + sh.offset * H, sh.rows * H);
  std::vector<A> dh(static_cast<std::size_t>(T * H), narrow_to<A>(-1.0f));
  std::vector<float> dw(static_cast<std::size_t>(sh.rows * H), 0.125f);
  auto put = [&](Component c, const void* src, std::size_t bytes) {
    Buffer b = dev.allocate(c, std::max<std::size_t>(bytes, 4));
    if (bytes) copy_to_device(dev, b.data(), src, bytes);
    return b;
  };
  Buffer hb = put(Component::layer, h.data(), h.size() * sizeof(A));
  Buffer tb = put(Component::layer, p.targets.data() + off, static_cast<std::size_t>(T) * 4);
  Buffer wb = put(Component::params, w.data(), w.size() * sizeof(A));
  Buffer dhb = put(Component::layer, dh.data(), dh.size() * sizeof(A));
  Buffer dwb = put(Component::grads, dw.data(), dw.size() * 4);
  LossSum ls;
  if (step) {
    ls = impl.forward_backward(hb.as<A>(), tb.as<std::int32_t>(), T, wb.as<A>(), scale, dhb.as<A>(), dwb.as<float>());
  } else {
    ls = impl.forward(hb.as<A>(), tb.as<std::int32_t>(), T, wb.as<A>());
    if (between) between();
    impl.backward(scale, dhb.as<A>(), dwb.as<float>());
  }
  copy_to_host(dev, dh.data(), dhb.data(), dh.size() * sizeof(A));
  copy_to_host(dev, dw.data(), dwb.data(), dw.size() * 4);
  Result res;
  for (const A& x : dh) {
    if constexpr (std::is_same_v<A, bf16>)
      res.dh.push_back(to_f32(x));
    else
      res.dh.push_back(x);
  }
  for (float x : dw) res.dw.push_back(x - 0.125f);
  double both[2] = {ls.loss, static_cast<double>(ls.count)};
  g.all_reduce(both, 2, DType::f64, ReduceOp::sum);
  res.loss = both[0];
  res.count = static_cast<std::int64_t>(both[1]);
  return res;
}

double rel_loss(const Result& a, const Result& ref) {
  if (ref.count == 0 || ref.loss == 0) return std::fabs(a.loss);
  return std::fabs(a.loss - ref.loss) / std::fabs(ref.loss);
}

double rel(Communicator& g, const std::vector<float>& a, const std::vector<float>& ref) {
  return verify::group_relative_error(g, a.data(), ref.data(), static_cast<std::int64_t>(a.size()));
}

// Cosine over the whole group's tensor (each rank holds its part); 1 when both are zero.
double cosine(Communicator& g, const std::vector<float>& a, const std::vector<float>& b) {
  double v[3] = {0, 0, 0};
  for (std::size_t i = 0; i < a.size(); ++i) {
    v[0] += static_cast<double>(a[i]) * b[i];
    v[1] += static_cast<double>(a[i]) * a[i];
    v[2] += static_cast<double>(b[i]) * b[i];
  }
  g.all_reduce(v, 3, DType::f64, ReduceOp::sum);
  if (v[1] == 0 && v[2] == 0) return 1.0;
  return v[0] / std::sqrt(v[1] * v[2]);
}

// Worst numbers seen, printed once per test on rank 0 (the report's figures).
struct Worst {
  double loss = 0, dh = 0, cos = 1;
  void see(double l, double d, double c) {
    loss = std::max(loss, l);
    dh = std::max(dh, d);
    cos = std::min(cos, c);
  }
};

struct Case {
  std::function<std::int64_t(int rank, int ranks)> tokens;
  std::int64_t hidden, vocab, chunk;
  double ignore;
  float z;
  int all_ignored_rank;
};

VocabProblem problem(const Case& c, int P, std::uint64_t seed, std::int32_t ignore_index) {
  VocabProblemSpec s;
  for (int r = 0; r < P; ++r) s.tokens.push_back(c.tokens(r, P));
  s.hidden = c.hidden;
  s.vocab = c.vocab;
  s.ignore_fraction = c.ignore;
  s.all_ignored_rank = c.all_ignored_rank;
  s.seed = seed;
  return make_vocab_problem(s, ignore_index);
}

void run_case(const Case& c) {
  Communicator& g = world();
  VocabLossOptions o;
  const VocabDims d{c.vocab, c.hidden};
  o.chunk = c.chunk;
  o.z_loss = c.z;
  const VocabProblem p = problem(c, g.size(), 17 + static_cast<std::uint64_t>(c.vocab), o.ignore_index);
  const float scale = 0.37f;
  CpuDevice dev(512ull << 20);
  auto ref32 = make_materialized_vocab_loss(dev, g, d, o);
  const Result ref = run<float>(*ref32, g, p, scale, false);
  o.precision = Precision::bf16;
  auto base16 = make_materialized_vocab_loss(dev, g, d, o);
  const Result base = run<bf16>(*base16, g, p, scale, false);
  Worst vs32, vsbase;
  struct Form {
    const char* name;
    RingMode mode;
    bool ring, step;
  };
  for (Form f : {Form{"materialized", RingMode::automatic, false, false},
                 Form{"materialized step", RingMode::automatic, false, true},
                 Form{"ring auto", RingMode::automatic, true, false},
                 Form{"ring activations", RingMode::activations, true, false},
                 Form{"ring weights", RingMode::weights, true, false},
                 Form{"ring step (fused at P=1)", RingMode::automatic, true, true},
                 Form{"ring activations step", RingMode::activations, true, true}}) {
    o.mode = f.mode;
    SCOPED_TRACE(std::string(f.name) + " P=" + std::to_string(g.size()) + " V=" + std::to_string(c.vocab) +
                 " H=" + std::to_string(c.hidden) + " chunk=" + std::to_string(c.chunk));
    auto loss = f.ring ? make_ring_dtp_vocab_loss(dev, g, d, o) : make_materialized_vocab_loss(dev, g, d, o);
    const Result got = run<bf16>(*loss, g, p, scale, f.step);
    if (f.ring && f.step) {
      EXPECT_EQ(loss->mode_used() == "fused", g.size() == 1);
    }
    EXPECT_EQ(got.count, ref.count);
    const double l = rel_loss(got, ref), dh = rel(g, got.dh, ref.dh), cw = cosine(g, got.dw, ref.dw);
    EXPECT_LE(l, 1e-5);
    EXPECT_LE(dh, 1e-2);
    EXPECT_GE(cw, 0.9999);
    vs32.see(l, dh, cw);
    const double lb = rel_loss(got, base), dhb = rel(g, got.dh, base.dh), cb = cosine(g, got.dw, base.dw);
    EXPECT_LE(lb, 1e-5);
    EXPECT_LE(dhb, 1e-2);
    EXPECT_GE(cb, 0.999);
    vsbase.see(lb, dhb, cb);
    EXPECT_EQ(dev.arena().live(Component::vocab), 0u) << "scratch must be released after backward";
  }
  if (g.rank() == 0)
    std::printf("[bf16 vocab P=%d V=%lld] vs f32: loss %.2e dh %.2e dW cos %.7f; vs bf16 baseline: loss %.2e dh %.2e "
                "dW cos %.7f\n",
                g.size(), static_cast<long long>(c.vocab), vs32.loss, vs32.dh, vs32.cos, vsbase.loss, vsbase.dh,
                vsbase.cos);
}

std::int64_t uneven(int r, int) { return 33 + 5 * r; }

TEST(VocabLossBf16, Plain) { run_case({[](int, int) { return 40; }, 16, 97, 8, 0.0, 0.0f, -1}); }

TEST(VocabLossBf16, OddVocabUnevenTokensIgnoreAndZLoss) { run_case({uneven, 12, 1001, 7, 0.2, 1e-3f, -1}); }

TEST(VocabLossBf16, ARankWithNoValidTarget) {
  run_case({[](int r, int) { return 21 + 5 * r; }, 8, 64, 5, 0.1, 1e-4f, 0});
}

TEST(VocabLossBf16, VocabularySmallerThanTheGroup) { run_case({[](int, int) { return 9; }, 8, 3, 4, 0.0, 0.0f, -1}); }

TEST(VocabLossBf16, RanksWithoutTokens) {
  run_case({[](int r, int P) { return r == P - 1 ? 0 : 19 + 2 * r; }, 12, 97, 5, 0.1, 0.0f, -1});
  run_case({[](int r, int) { return r == 0 ? 0 : 11; }, 12, 97, 1000, 0.0, 1e-3f, -1});
}

// More than one 256-row gradient tile in the baseline (N > 256) and in the fused block.
TEST(VocabLossBf16, SeveralGradientTiles) {
  run_case({[](int r, int) { return 301 + r; }, 24, 389, 300, 0.05, 0.0f, -1});
}

TEST(VocabLossBf16, WrongPointerTypeIsAnError) {
  Communicator& g = world();
  VocabLossOptions o;
  o.precision = Precision::bf16;
  CpuDevice dev(64ull << 20);
  auto loss = make_ring_dtp_vocab_loss(dev, g, {10, 4}, o);
  std::vector<float> h(8, 1.0f), w(40, 0.5f);
  std::vector<std::int32_t> t = {1, 2};
  try {
    loss->forward(h.data(), t.data(), 2, w.data());
    ADD_FAILURE() << "an f32 forward of a bf16 loss must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "vocab loss runs in bf16 but was given f32 hidden states");
  }
}

// ---- measured Arena peaks == the bf16 footprints ---------------------------------------

std::uint64_t vocab_bytes(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::vocab)];
}

void check_footprints(const Case& c) {
  Communicator& g = world();
  VocabLossOptions o;
  o.precision = Precision::bf16;
  o.chunk = c.chunk;
  o.z_loss = c.z;
  const VocabProblem p = problem(c, g.size(), 5 + static_cast<std::uint64_t>(c.vocab), o.ignore_index);
  VocabLossShape shape;
  shape.tokens = p.spec.tokens;
  shape.dims = {c.vocab, c.hidden};
  shape.rank = g.rank();
  struct Impl {
    const char* name;
    bool ring;
    RingMode mode;
  };
  for (Impl impl : {Impl{"materialized", false, RingMode::automatic},
                    Impl{"ring activations", true, RingMode::activations},
                    Impl{"ring weights", true, RingMode::weights}}) {
    o.mode = impl.mode;
    SCOPED_TRACE(std::string(impl.name) + " P=" + std::to_string(g.size()) + " rank=" + std::to_string(g.rank()) +
                 " V=" + std::to_string(c.vocab) + " chunk=" + std::to_string(c.chunk));
    const Footprint fp = impl.ring ? ring_dtp_footprint(shape, o, Precision::bf16)
                                   : materialized_vocab_footprint(shape, o, Precision::bf16);
    CpuDevice dev(64ull << 20);
    auto loss = impl.ring ? make_ring_dtp_vocab_loss(dev, g, shape.dims, o)
                          : make_materialized_vocab_loss(dev, g, shape.dims, o);
    Arena& a = dev.arena();
    a.reset_peaks();
    std::uint64_t fwd = 0, saved = 0;
    run<bf16>(*loss, g, p, 0.5f, false, [&] {
      fwd = a.peak(Component::vocab);
      saved = a.live(Component::vocab);
      a.reset_peaks();
    });
    EXPECT_EQ(fwd, vocab_bytes(fp, "forward"));
    EXPECT_EQ(saved, vocab_bytes(fp, "saved"));
    EXPECT_EQ(a.peak(Component::vocab), vocab_bytes(fp, "backward"));
    EXPECT_EQ(a.live(Component::vocab), 0u);
  }
  o.mode = RingMode::automatic;
  const Footprint step = ring_dtp_step_footprint(shape, o, Precision::bf16);
  CpuDevice dev(64ull << 20);
  auto loss = make_ring_dtp_vocab_loss(dev, g, shape.dims, o);
  dev.arena().reset_peaks();
  run<bf16>(*loss, g, p, 0.5f, true);
  EXPECT_EQ(dev.arena().peak(Component::vocab), step.device_peak(Component::vocab)) << "forward_backward";
  EXPECT_EQ(dev.arena().live(Component::vocab), 0u);
}

TEST(VocabLossBf16, MeasuredEqualsFootprint) {
  check_footprints({[](int, int) { return 37; }, 12, 97, 5, 0.1, 0.0f, -1});
  check_footprints({uneven, 12, 97, 8, 0.1, 1e-3f, -1});
  check_footprints({[](int r, int P) { return r == P - 1 ? 0 : 19 + r; }, 8, 2, 3, 0.0, 0.0f, -1});
  check_footprints({[](int r, int) { return 260 + r; }, 8, 1001, 7, 0.0, 0.0f, -1});
}

// ---- keep_logits: the forward's blocks in the backward, the same bits ------------------

// Ring-DTP with keep_logits against itself without: the backward turns the kept blocks into
// their gradients instead of computing them again, so the loss, d_hidden and dW are the
// same bits (f32 and bf16, both ring modes, forward + backward and forward_backward), a
// block's logits GEMM fewer in the backward (3 of 4 at P > 1), and the measured peaks equal
// the kept footprint's phases. At P = 1 forward_backward takes the fused form (nothing
// kept) and forward + backward keep nothing either (the footprint's kept term is 0).
template <class A>
void check_kept(const Case& c) {
  Communicator& g = world();
  const int P = g.size();
  VocabLossOptions o;
  o.precision = std::is_same_v<A, bf16> ? Precision::bf16 : Precision::f32;
  o.chunk = c.chunk;
  o.z_loss = c.z;
  const VocabProblem p = problem(c, P, 23 + static_cast<std::uint64_t>(c.vocab), o.ignore_index);
  VocabLossShape shape;
  shape.tokens = p.spec.tokens;
  shape.dims = {c.vocab, c.hidden};
  shape.rank = g.rank();
  for (RingMode mode : {RingMode::activations, RingMode::weights}) {
    for (bool step : {false, true}) {
      o.mode = mode;
      SCOPED_TRACE(std::string(precision_name(o.precision)) + " " + std::string(ring_mode_name(mode)) +
                   (step ? " forward_backward" : " forward + backward") + " P=" + std::to_string(P) + " rank=" +
                   std::to_string(g.rank()) + " V=" + std::to_string(c.vocab) + " chunk=" + std::to_string(c.chunk));
      CpuDevice dev(64ull << 20);
      o.keep_logits = false;
      auto again = make_ring_dtp_vocab_loss(dev, g, shape.dims, o);
      const Result ref = run<A>(*again, g, p, 0.37f, step);
      o.keep_logits = true;
      const Footprint fp = ring_dtp_footprint(shape, o, o.precision);
      auto kept = make_ring_dtp_vocab_loss(dev, g, shape.dims, o);
      Arena& a = dev.arena();
      a.reset_peaks();
      std::uint64_t fwd = 0, saved = 0;
      const Result got = run<A>(*kept, g, p, 0.37f, step, [&] {
        fwd = a.peak(Component::vocab);
        saved = a.live(Component::vocab);
        a.reset_peaks();
      });
      EXPECT_EQ(got.loss, ref.loss);
      EXPECT_EQ(got.count, ref.count);
      EXPECT_EQ(got.dh, ref.dh);
      EXPECT_EQ(got.dw, ref.dw);
      EXPECT_EQ(a.live(Component::vocab), 0u) << "the kept blocks are released by the backward";
      if (step && P == 1) {
        EXPECT_EQ(kept->mode_used(), "fused");
        continue;
      }
      if (step) {  // forward then backward inside: the whole step's peak
        EXPECT_EQ(a.peak(Component::vocab), fp.device_peak(Component::vocab));
      } else {
        EXPECT_EQ(fwd, vocab_bytes(fp, "forward"));
        EXPECT_EQ(saved, vocab_bytes(fp, "saved"));
        EXPECT_EQ(a.peak(Component::vocab), vocab_bytes(fp, "backward"));
      }
      const VocabLossStats& k = kept->stats();
      const VocabLossStats& r = again->stats();
      if (P > 1) {
        // Each block: logits once (not twice) and the two gradient products.
        EXPECT_EQ(4 * k.gemm_calls, 3 * r.gemm_calls) << k.gemm_calls << " against " << r.gemm_calls;
      } else {
        EXPECT_EQ(k.gemm_calls, r.gemm_calls) << "one rank keeps nothing";
      }
    }
  }
}

TEST(VocabLossBf16, KeptLogitsAreTheRecomputedOnesBitForBit) {
  const Case cases[] = {
      {uneven, 12, 97, 8, 0.1, 1e-3f, -1},
      {[](int r, int P) { return r == P - 1 ? 0 : 19 + 2 * r; }, 8, 61, 5, 0.2, 0.0f, -1},  // a rank without tokens
      {[](int r, int) { return 9 + r; }, 8, 3, 4, 0.0, 0.0f, 0},  // V < P at 4 ranks; rank 0 scores nothing
      {[](int r, int) { return 37 + r; }, 16, 1001, 1000, 0.0, 0.0f, -1},  // one chunk a block
  };
  for (const Case& c : cases) {
    check_kept<float>(c);
    check_kept<bf16>(c);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
