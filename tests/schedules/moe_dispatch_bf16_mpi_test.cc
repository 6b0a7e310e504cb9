// MoeDispatch in bf16 at the launched group size (1 without mpirun; 2, 3, 4 under
// mpirun), for standard EP, LLEP, PipelinedLLEP (a cap of 7 copies: several rounds) and
// PipelinedLLEP under a round_bytes budget with max_lent 2, on odd shapes (H = 20,
// F = 13), every skew (hot: LLEP lends; source: a rank without tokens), one token (most
// experts empty) and none:
//   - against the f32 dispatch on the widened inputs (x, dy, experts rounded to bf16 and
//     widened back; routing weights fp32 in both): y and the routing-weight gradients
//     norm-wise relative <= 1e-2, dx <= 2e-2, the expert gradients' cosine >= 0.999. Why:
//     each stored activation (gate, up, act, out, dy * w, dact, dgate, dup, dx, the
//     combined y/dx) rounds by up to 2^-9 relative and a few roundings chain;
//   - each kind against standard EP in bf16, same bounds (the combine's fp32 sum order
//     and a pipelined token's per-round rounding differ);
//   - the measured Arena peak of Component::dispatch, forward and backward, equals
//     dispatch_footprint(bf16) of the plan every rank derives, and of the runtime's sizes.
// And the routing weight travels bit for bit: with one expert and top-1 routing, the
// bf16 dispatch's y, dx and routing-weight gradients are bitwise the bf16 FFN and the
// bf16 row ops applied to this rank's own rows with the exact fp32 weight (its rows
// reach expert 0's owner through the exchange, the weight in two bf16 slots; a weight
// truncated to bf16 scales dy differently). That holds for every kind and group size (a
// row may reach a helper, with a bf16 copy of the weights, or a later round) because a
// gemm_bf16 row does not depend on the other rows of the product (nn/linear's test pins
// the row tiling); the expert gradients are compared bitwise at one rank in one round.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <type_traits>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/nn/linear.h"
#include "peakbound/nn/swiglu_ffn.h"
#include "peakbound/ops/moe_permute.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/verify/moe_reference.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::rounded;
using test_bf16::widened;
using testing::world;

constexpr std::int64_t kH = 20, kF = 13, kE = 12;  // E divisible by EP in {1, 2, 3, 4}
// dx chains the most roundings: dy * w, the recomputed gate/up/act, dact, dgate and dup,
// each copy's dx and the combine (about 8 against y's 5); measured up to 1.1e-2 (hot skew,
// one rank), so its bound is the 2e-2 the plan gives gradients through a schedule.
constexpr double kDxBound = 2e-2;

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

MoeProblemSpec spec(std::int64_t tokens, std::int64_t top_k, Skew skew) {
  MoeProblemSpec s;
  s.shape = MoeShape{kH, kF, kE, top_k};
  s.ranks = world().size();
  s.tokens = tokens;
  s.skew = skew;
  s.seed = 17;
  return s;
}

struct Kind {
  DispatchKind kind;
  DispatchOptions o;
  std::string name;
};

std::vector<Kind> kinds() {
  DispatchOptions small;
  small.min_spill = 4;
  small.cap = 7;  // divides nothing here
  DispatchOptions budget = small;
  budget.round_bytes = 48 << 10;
  budget.max_lent = 2;
  return {{DispatchKind::standard_ep, small, "standard_ep"},
          {DispatchKind::llep, small, "llep"},
          {DispatchKind::pipelined_llep, small, "pipelined_llep cap 7"},
          {DispatchKind::pipelined_llep, budget, "pipelined_llep round_bytes 48KiB max_lent 2"}};
}

template <class A>
std::vector<float> as_f32(const std::vector<A>& v) {
  if constexpr (std::is_same_v<A, bf16>)
    return widened(v);
  else
    return v;
}

// One rank's results of a forward and a backward, and what the dispatch measured.
struct Out {
  std::vector<float> y, dx, dw, dparams;
  std::uint64_t forward_peak = 0, backward_peak = 0;
  DispatchStats stats;
};

// The dispatch on this rank's slice of the whole-problem tensors x, dy and experts
// (A = float or bf16; routing from p).
template <class A>
Out run(const MoeProblem& p, const std::vector<A>& x, const std::vector<A>& dy, const std::vector<A>& params,
        const Kind& k, Precision precision) {
  Communicator& g = world();
  const int r = g.rank();
  const MoeShape& s = p.spec.shape;
  const std::int64_t K = s.top_k, local = kE / g.size(), EF = s.expert_floats();
  const std::int64_t T = p.tokens[at(r)], off = p.offset(r);
  CpuDevice dev(256ull << 20);
  MoeDispatch d(dev, g, s, k.kind, k.o, precision);
  std::vector<A> y(at(T * kH)), dx(y.size());
  Out o;
  o.dw.assign(at(T * K), 0.0f);
  o.dparams.assign(at(local * EF), 0.0f);
  const A* P = params.data() + r * local * EF;
  const std::int32_t* ids = p.ids.data() + off * K;
  const float* w = p.weights.data() + off * K;
  dev.arena().reset_peaks();
  d.forward(x.data() + off * kH, T, ids, w, P, y.data());
  o.forward_peak = dev.arena().peak(Component::dispatch);
  dev.arena().reset_peaks();
  d.backward(x.data() + off * kH, T, ids, w, P, dy.data() + off * kH, dx.data(), o.dw.data(), o.dparams.data());
  o.backward_peak = dev.arena().peak(Component::dispatch);
  EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
  o.stats = d.stats();
  o.y = as_f32(y);
  o.dx = as_f32(dx);
  return o;
}

double group_cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double s[3] = {0, 0, 0};
  for (std::size_t i = 0; i < a.size(); ++i) {
    s[0] += static_cast<double>(a[i]) * b[i];
    s[1] += static_cast<double>(a[i]) * a[i];
    s[2] += static_cast<double>(b[i]) * b[i];
  }
  world().all_reduce(s, 3, DType::f64, ReduceOp::sum);
  return s[1] > 0 && s[2] > 0 ? s[0] / std::sqrt(s[1] * s[2]) : (s[1] == s[2] ? 1.0 : 0.0);
}

double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  return verify::group_relative_error(world(), a.data(), ref.data(), static_cast<std::int64_t>(a.size()));
}

// The worst errors measured so far (printed by each test on rank 0).
struct Worst {
  double y = 0, dx = 0, dw = 0, dparams = 0, cosine = 1;
  void print(const char* test) {
    if (world().rank() == 0)
      std::printf("%s: worst relative y %.3g, dx %.3g, routing-weight grads %.3g, dW %.3g; worst dW cosine %.6f\n",
                  test, y, dx, dw, dparams, cosine);
    *this = Worst{};
  }
};
Worst worst;

// y relative <= 1e-2, dx <= kDxBound, expert gradients cosine >= 0.999 and relative
// <= 1e-2 (each an fp32 sum of products of bf16 factors: 2^-8 per product). The routing-
// weight gradients dw = dy . out are dot products that can cancel: cosine >= 0.999
// always, and relative <= 1e-2 where there are enough of them (`dw_relative`; with one
// token a rank, the few dots' max is no scale: 3e-2 measured).
void expect_close(const Out& a, const Out& ref, const std::string& what, bool dw_relative) {
  SCOPED_TRACE(what);
  const double ey = rel(a.y, ref.y), edx = rel(a.dx, ref.dx), edw = rel(a.dw, ref.dw);
  const double cos = group_cosine(a.dparams, ref.dparams), edp = rel(a.dparams, ref.dparams);
  EXPECT_LE(ey, 1e-2);
  EXPECT_LE(edx, kDxBound);
  if (dw_relative) {
    EXPECT_LE(edw, 1e-2);
  }
  EXPECT_GE(cos, 0.999);
  EXPECT_LE(edp, 1e-2);  // the cosine alone would pass a gradient added twice
  EXPECT_GE(group_cosine(a.dw, ref.dw), 0.999);
  worst.y = std::max(worst.y, ey), worst.dx = std::max(worst.dx, edx), worst.dparams = std::max(worst.dparams, edp);
  if (dw_relative) worst.dw = std::max(worst.dw, edw);
  worst.cosine = std::min(worst.cosine, cos);
}

// The footprint of this rank's plan under bf16, from the whole problem's routing.
Footprint bf16_footprint(const MoeProblem& p, const Kind& k) {
  const MoeShape& s = p.spec.shape;
  const int P = p.spec.ranks, r = world().rank();
  std::vector<std::int64_t> counts(at(P * kE), 0);
  for (int q = 0; q < P; ++q)
    for (std::int64_t c = 0; c < p.tokens[at(q)] * s.top_k; ++c)
      ++counts[at(q * kE + p.ids[at(p.offset(q) * s.top_k + c)])];
  const MoePlan plan = dispatch_plan(k.kind, s, P, counts, k.o, Precision::bf16);
  return dispatch_footprint(s, dispatch_sizes(plan, r, p.tokens[at(r)]), Precision::bf16);
}

std::uint64_t dispatch_of(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::dispatch)];
}

void expect_bf16_dispatch(const MoeProblemSpec& sp, bool spills) {
  const bool many = sp.tokens >= 32;
  const MoeProblem p = make_moe_problem(sp);
  const std::vector<bf16> x = rounded(p.x), dy = rounded(p.dy), params = rounded(p.params);
  const std::vector<float> xw = widened(x), dyw = widened(dy), paramsw = widened(params);
  const std::string where = "skew " + std::string(skew_name(sp.skew)) + " k " + std::to_string(sp.shape.top_k) +
                            " tokens " + std::to_string(sp.tokens) + " EP " + std::to_string(world().size());
  Out standard;
  for (const Kind& k : kinds()) {
    const std::string what = k.name + ", " + where;
    SCOPED_TRACE(what);
    const Out f32 = run(p, xw, dyw, paramsw, k, Precision::f32);
    const Out b = run(p, x, dy, params, k, Precision::bf16);
    expect_close(b, f32, "bf16 against f32 on widened inputs, " + what, many);
    if (k.kind == DispatchKind::standard_ep)
      standard = b;
    else
      expect_close(b, standard, "bf16 against bf16 standard EP, " + what, many);
    if (k.kind == DispatchKind::pipelined_llep && k.o.round_bytes == 0 && sp.tokens * sp.shape.top_k > 7) {
      EXPECT_GT(b.stats.rounds, 1);  // a token's copies can come home in different rounds
    }
    if (spills && k.kind != DispatchKind::standard_ep && world().size() > 1) {
      EXPECT_TRUE(b.stats.spilled);
    }
    // Measured == footprint(bf16), from the problem's plan and from the runtime's sizes.
    const Footprint fp = bf16_footprint(p, k);
    EXPECT_EQ(b.forward_peak, dispatch_of(fp, "forward"));
    EXPECT_EQ(b.backward_peak, dispatch_of(fp, "backward"));
    EXPECT_EQ(dispatch_peak_bytes(sp.shape, b.stats.sizes, Precision::bf16), fp.device_peak(Component::dispatch));
    // The f32 dispatch still holds what its own footprint says.
    const Footprint f4 = dispatch_footprint(sp.shape, f32.stats.sizes, sizeof(float));
    EXPECT_EQ(f32.forward_peak, dispatch_of(f4, "forward"));
    EXPECT_EQ(f32.backward_peak, dispatch_of(f4, "backward"));
  }
}

TEST(MoeDispatchBf16, AgainstF32AndStandardEpForEveryTopK) {
  for (std::int64_t k : {1, 2, 4}) expect_bf16_dispatch(spec(37, k, Skew::uniform), false);
  worst.print("every top-k");
}

TEST(MoeDispatchBf16, AgainstF32AndStandardEpForEverySkew) {
  expect_bf16_dispatch(spec(41, 2, Skew::hot), true);
  for (Skew s : {Skew::zipf, Skew::all_to_one_rank, Skew::one_expert, Skew::source})
    expect_bf16_dispatch(spec(41, 2, s), false);
  worst.print("every skew");
}

TEST(MoeDispatchBf16, AgainstF32WithEmptyExpertsAndFewTokens) {
  expect_bf16_dispatch(spec(1, 1, Skew::uniform), false);  // most experts get no copy
  expect_bf16_dispatch(spec(0, 2, Skew::uniform), false);  // no tokens anywhere
  worst.print("few tokens");
}

TEST(MoeDispatchBf16, RoutingWeightTravelsBitForBit) {
  Communicator& g = world();
  MoeProblem p = make_moe_problem(spec(23, 1, Skew::one_expert));  // every copy to expert 0 (rank 0)
  // Top-1 weights renormalize to 1 (exact in bf16): take weights that bf16 cannot hold.
  for (std::size_t i = 0; i < p.weights.size(); ++i) {
    p.weights[i] = 0.61803398f + 0.00123457f * static_cast<float>(i);
    ASSERT_NE(float_bits(p.weights[i]) & 0xffffu, 0u);
  }
  const std::vector<bf16> x = rounded(p.x), dy = rounded(p.dy), params = rounded(p.params);
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name + " EP " + std::to_string(g.size()));
    const Out b = run(p, x, dy, params, k, Precision::bf16);
    // This rank's rows through the bf16 FFN of expert 0 and the row ops, as the expert's rank computes them.
    const std::int64_t T = p.tokens[at(g.rank())], off = p.offset(g.rank()), EF = p.spec.shape.expert_floats();
    CpuDevice dev(64ull << 20);
    Stream& s = dev.compute_stream();
    const bf16* W = params.data();
    const SwigluFfnWeightsBf16 w{W, W + kF * kH, W + 2 * kF * kH};
    std::vector<bf16> G(at(T * kF)), U(G.size()), Act(G.size()), O(at(T * kH)), DY(dy.begin() + off * kH,
                                                                                      dy.begin() + (off + T) * kH);
    std::vector<float> tile(at(std::min<std::int64_t>(T, kLinearTileRows) * std::max(kH, kF))), dw(at(T)),
        dW(at(EF), 0.0f);
    swiglu_ffn_forward(dev, s, T, kH, kF, x.data() + off * kH, w, G.data(), U.data(), Act.data(), O.data(), false,
                       tile.data());
    std::vector<bf16> y_ref(O.size());
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < kH; ++j) {
        float acc = 0.0f;  // the combine: y[t] (zeroed) + w * out, rounded once
        acc += p.weights[at(off + t)] * widen(O[at(t * kH + j)]);
        y_ref[at(t * kH + j)] = to_bf16(acc);
      }
    ops::moe_dot_scale_rows(dev, s, dw.data(), DY.data(), O.data(), p.weights.data() + off, T, kH);
    swiglu_ffn_backward(dev, s, T, kH, kF, x.data() + off * kH, w, DY.data(), G.data(), U.data(), Act.data(),
                        SwigluFfnGrads{dW.data(), dW.data() + kF * kH, dW.data() + 2 * kF * kH}, O.data(), false,
                        tile.data());
    dev.synchronize(s);
    std::vector<float> dx_ref = widened(O);
    for (float& v : dx_ref) v = widen(to_bf16(0.0f + v));  // the combine: dx[t] (zeroed) + the row, rounded once
    EXPECT_EQ(test_bf16::bits_of(rounded(b.y)), test_bf16::bits_of(y_ref));
    EXPECT_EQ(test_bf16::bits_of(b.dx), test_bf16::bits_of(dx_ref));
    EXPECT_EQ(test_bf16::bits_of(b.dw), test_bf16::bits_of(dw));
    if (g.size() == 1 && k.kind != DispatchKind::pipelined_llep) {  // one product over all rows: same sums
      std::vector<float> dW0(b.dparams.begin(), b.dparams.begin() + EF);
      EXPECT_EQ(test_bf16::bits_of(dW0), test_bf16::bits_of(dW));
    }
  }
}

TEST(MoeDispatchBf16, TensorsOfTheOtherPrecisionAreRefused) {
  Communicator& g = world();
  CpuDevice dev(16ull << 20);
  const MoeShape s{4, 4, 12, 1};
  MoeDispatch d(dev, g, s, DispatchKind::standard_ep, DispatchOptions{}, Precision::bf16);
  std::vector<float> x(4), w(1, 1.0f), y(4), params(at(12 / g.size() * s.expert_floats()));
  std::vector<std::int32_t> ids = {0};
  try {
    d.forward(x.data(), 1, ids.data(), w.data(), params.data(), y.data());
    ADD_FAILURE() << "a bf16 dispatch ran f32 tensors";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "moe dispatch runs in bf16 but was given f32 tensors");
  }
  std::vector<float> dw(1), dparams(params.size());
  EXPECT_THROW(d.backward(x.data(), 1, ids.data(), w.data(), params.data(), y.data(), x.data(), dw.data(),
                          dparams.data()),
               InvalidArgument);
  // And the other way: an f32 dispatch refuses bf16 tensors, forward and backward.
  MoeDispatch d32(dev, g, s, DispatchKind::standard_ep, DispatchOptions{}, Precision::f32);
  std::vector<bf16> x16(4), y16(4), params16(params.size());
  EXPECT_THROW(d32.forward(x16.data(), 1, ids.data(), w.data(), params16.data(), y16.data()), InvalidArgument);
  EXPECT_THROW(d32.backward(x16.data(), 1, ids.data(), w.data(), params16.data(), y16.data(), x16.data(), dw.data(),
                            dparams.data()),
               InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
