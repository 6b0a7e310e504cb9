// Standard EP, LLEP and PipelinedLLEP against a dense double-precision reference at the
// launched group size (1 without mpirun; 2, 3, 4 under mpirun), for every routing skew,
// top-k in {1, 2, 4, 8}, experts with no tokens, a rank with no tokens, and a cap that
// does not divide the copies. Plus the claims: LLEP spills under skew, the pipelined
// dispatch peak does not grow with the tokens or the skew, standard EP's does; under a
// round_bytes budget (and a max_lent bound) PipelinedLLEP stays exact and its peak flat.
#include <gtest/gtest.h>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/verify/moe_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

MoeProblemSpec spec(std::int64_t tokens, std::int64_t top_k, Skew skew, std::uint64_t seed = 3) {
  MoeProblemSpec s;
  s.shape.hidden = 12;
  s.shape.ffn = 10;
  s.shape.experts = 12;  // divisible by EP in {1, 2, 3, 4}
  s.shape.top_k = top_k;
  s.ranks = world().size();
  s.tokens = tokens;
  s.skew = skew;
  s.seed = seed;
  return s;
}

DispatchOptions small_knobs() {
  DispatchOptions k;
  k.min_spill = 4;
  k.cap = 7;  // divides nothing here
  return k;
}

// PipelinedLLEP under a round budget of a few copies a round, lent copies bounded to 2.
DispatchOptions budget_knobs() {
  DispatchOptions k = small_knobs();
  k.round_bytes = 48 << 10;
  k.max_lent = 2;
  return k;
}

void expect_exact(const MoeProblemSpec& sp) {
  Communicator& g = world();
  MoeProblem p = make_moe_problem(sp);
  MoeReference ref = dense_moe_reference(p);
  for (int run = 0; run < 5; ++run) {
    const DispatchKind kind = run < 3 ? static_cast<DispatchKind>(run) : run == 3 ? DispatchKind::pipelined_llep
                                                                                  : DispatchKind::llep;
    CpuDevice dev(256ull << 20);
    MoeDispatch d(dev, g, sp.shape, kind, run < 3 ? small_knobs() : budget_knobs());
    MoeCheck c = check_moe_dispatch(d, g, p, ref);
    SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + (run < 3 ? "" : " round_bytes 48KiB max_lent 2") +
                 " rounds " + std::to_string(d.stats().rounds) + " skew=" + std::string(skew_name(sp.skew)) +
                 " k=" + std::to_string(sp.shape.top_k) + " EP=" + std::to_string(g.size()));
    EXPECT_LT(c.rel_err_y, 1e-5);
    EXPECT_LT(c.rel_err_dx, 1e-5);
    EXPECT_LT(c.rel_err_dw, 1e-5);
    EXPECT_LT(c.rel_err_dparams, 1e-5);
    EXPECT_EQ(dev.arena().live(), 0u);
  }
}

TEST(MoeDispatch, ExactForEveryTopK) {
  for (std::int64_t k : {1, 2, 4, 8}) expect_exact(spec(37, k, Skew::uniform));
}

TEST(MoeDispatch, ExactForEverySkew) {
  for (Skew s : {Skew::zipf, Skew::hot, Skew::all_to_one_rank, Skew::one_expert, Skew::source})
    expect_exact(spec(41, 2, s));
}

TEST(MoeDispatch, ExactWithEmptyExpertsAndFewTokens) {
  expect_exact(spec(1, 1, Skew::uniform));   // at most P copies: most experts get none
  expect_exact(spec(0, 2, Skew::uniform));   // no tokens anywhere
}

TEST(MoeDispatch, LlepSpillsUnderHotSkewAndPipelinedBoundsTheRound) {
  Communicator& g = world();
  if (g.size() < 2) GTEST_SKIP() << "spilling needs EP > 1";
  MoeProblem p = make_moe_problem(spec(200, 2, Skew::hot));
  std::vector<float> y(static_cast<std::size_t>(200 * 12));
  const std::int64_t local = 12 / g.size(), T = p.tokens[static_cast<std::size_t>(g.rank())], off = p.offset(g.rank());
  for (DispatchKind kind : {DispatchKind::llep, DispatchKind::pipelined_llep}) {
    CpuDevice dev(64ull << 20);
    MoeDispatch d(dev, g, p.spec.shape, kind, small_knobs());
    d.forward(p.x.data() + off * 12, T, p.ids.data() + off * 2, p.weights.data() + off * 2,
              p.params.data() + g.rank() * local * p.spec.shape.expert_floats(), y.data());
    EXPECT_TRUE(d.stats().spilled);
    EXPECT_GT(d.stats().spills, 0);
    if (kind == DispatchKind::pipelined_llep) {
      EXPECT_GT(d.stats().rounds, 1);
      // Balanced to alpha x the round's mean (cap per source), plus one spill piece.
      EXPECT_LE(d.stats().max_received_rows, 7 + 4 + g.size());
    }
  }
}

std::uint64_t dispatch_peak(DispatchKind kind, std::int64_t tokens, Skew skew, std::uint64_t round_bytes = 0) {
  Communicator& g = world();
  MoeProblemSpec sp = spec(tokens, 2, skew, 9);
  sp.shape.hidden = 32;
  sp.shape.ffn = 64;
  MoeProblem p = make_moe_problem(sp);
  const std::int64_t H = 32, K = 2, local = 12 / g.size(), T = p.tokens[static_cast<std::size_t>(g.rank())],
                     off = p.offset(g.rank()), EF = sp.shape.expert_floats();
  std::vector<float> y(static_cast<std::size_t>(T * H)), dx(y.size()), dw(static_cast<std::size_t>(T * K)),
      dp(static_cast<std::size_t>(local * EF));
  CpuDevice dev(256ull << 20);
  DispatchOptions kn;
  kn.min_spill = 16;
  kn.cap = 64;
  kn.round_bytes = round_bytes;
  MoeDispatch d(dev, g, sp.shape, kind, kn);
  const float* params = p.params.data() + g.rank() * local * EF;
  d.forward(p.x.data() + off * H, T, p.ids.data() + off * K, p.weights.data() + off * K, params, y.data());
  d.backward(p.x.data() + off * H, T, p.ids.data() + off * K, p.weights.data() + off * K, params,
             p.dy.data() + off * H, dx.data(), dw.data(), dp.data());
  std::int64_t peak = static_cast<std::int64_t>(dev.arena().peak(Component::dispatch));
  g.all_reduce(&peak, 1, DType::i64, ReduceOp::max);
  return static_cast<std::uint64_t>(peak);
}

TEST(MoeDispatch, PipelinedPeakIsFlatInTokensAndSkew) {
  Communicator& g = world();
  if (g.size() < 2) GTEST_SKIP() << "the bound is about the EP exchange";
  std::uint64_t small = dispatch_peak(DispatchKind::pipelined_llep, 256, Skew::uniform);
  std::uint64_t big = dispatch_peak(DispatchKind::pipelined_llep, 2048, Skew::uniform);
  std::uint64_t hot_small = dispatch_peak(DispatchKind::pipelined_llep, 256, Skew::hot);
  std::uint64_t hot = dispatch_peak(DispatchKind::pipelined_llep, 2048, Skew::hot);
  EXPECT_LE(static_cast<double>(big), 1.10 * static_cast<double>(small)) << small << " -> " << big;
  EXPECT_LE(static_cast<double>(hot), 1.10 * static_cast<double>(hot_small)) << hot_small << " -> " << hot;
  // Skew may add helpers' copies of spilled experts (weights and their gradients), at most
  // the experts a rank does not own; nothing that grows with the tokens.
  const double expert_bytes = 3.0 * 32 * 64 * 4, foreign = 12 - 12 / g.size();
  EXPECT_LE(static_cast<double>(hot), 1.10 * static_cast<double>(big) + 2 * foreign * expert_bytes);
  std::uint64_t std_small = dispatch_peak(DispatchKind::standard_ep, 256, Skew::uniform);
  std::uint64_t std_big = dispatch_peak(DispatchKind::standard_ep, 2048, Skew::uniform);
  EXPECT_GT(std_big, 6 * std_small) << "standard EP grows with the tokens";
  EXPECT_LT(big, std_big);
}

TEST(MoeDispatch, PipelinedPeakUnderARoundBudgetIsFlatFrom1To8xTheTokens) {
  // Full rounds sized to the budget: the peak sits just under it whatever the tokens,
  // uniform or hot, while LLEP's grows with them.
  Communicator& g = world();
  if (g.size() < 2) GTEST_SKIP() << "the bound is about the EP exchange";
  const std::uint64_t budget = 1ull << 20;
  for (Skew s : {Skew::uniform, Skew::hot}) {
    std::uint64_t lo = ~0ull, hi = 0;
    for (std::int64_t t : {512, 1024, 2048, 4096}) {
      const std::uint64_t peak = dispatch_peak(DispatchKind::pipelined_llep, t, s, budget);
      EXPECT_LE(peak, budget);
      lo = std::min(lo, peak), hi = std::max(hi, peak);
    }
    EXPECT_LE(static_cast<double>(hi), 1.10 * static_cast<double>(lo)) << skew_name(s) << ": " << lo << " .. " << hi;
    EXPECT_GT(dispatch_peak(DispatchKind::llep, 4096, s), 2 * budget) << "LLEP holds a whole round of 4096 tokens";
  }
}

TEST(MoeDispatch, BadExpertIdIsAnErrorOnEveryRank) {
  Communicator& g = world();
  MoeShape s{4, 4, 12, 1};
  CpuDevice dev(16ull << 20);
  MoeDispatch d(dev, g, s, DispatchKind::standard_ep, DispatchOptions{});
  std::vector<float> x(8, 1.0f), w(2, 1.0f), y(8), params(static_cast<std::size_t>(12 / g.size() * s.expert_floats()), 0.1f);
  std::vector<std::int32_t> ids = {0, g.rank() == 0 ? 12 : 1};
  EXPECT_THROW(d.forward(x.data(), 2, ids.data(), w.data(), params.data(), y.data()), InvalidArgument);
  EXPECT_THROW(MoeDispatch(dev, g, MoeShape{4, 4, 12, 13}, DispatchKind::llep, DispatchOptions{}), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
