// The dispatch footprint is what MoeDispatch holds: at the launched group size (1 to 4
// ranks), for every kind, skew, top-k in {1, 2, 4}, caps that divide nothing (7) or are
// larger than any round, and ranks with no tokens, the Arena's measured peak of
// Component::dispatch in forward, and (after reset_peaks) in backward, equals the
// footprint's "forward" / "backward" phase computed from the problem alone; under a
// round_bytes budget (with and without a max_lent bound) too, and PipelinedLLEP's
// footprint then stays within the budget.
#include <gtest/gtest.h>

#include <string>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/verify/moe_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

std::uint64_t phase_bytes(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::dispatch)];
}

void expect_footprint(Skew skew, std::int64_t top_k, std::int64_t cap, std::int64_t tokens,
                      std::uint64_t round_bytes = 0, std::int64_t max_lent = 0) {
  Communicator& g = world();
  const int r = g.rank();
  MoeProblemSpec sp;
  sp.shape = MoeShape{12, 10, 12, top_k};
  sp.ranks = g.size();
  sp.tokens = tokens;
  sp.skew = skew;
  sp.seed = 11;
  const MoeProblem p = make_moe_problem(sp);
  const std::int64_t H = 12, K = top_k, local = 12 / g.size(), EF = sp.shape.expert_floats();
  const std::int64_t T = p.tokens[static_cast<std::size_t>(r)], off = p.offset(r);
  DispatchOptions o;
  o.cap = cap;
  o.min_spill = 3;
  o.round_bytes = round_bytes;
  o.max_lent = max_lent;
  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
    SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " skew " + std::string(skew_name(skew)) + " k " +
                 std::to_string(top_k) + " cap " + std::to_string(cap) + " tokens " + std::to_string(tokens) +
                 " round_bytes " + std::to_string(round_bytes) + " max_lent " + std::to_string(max_lent) +
                 " EP " + std::to_string(g.size()) + " rank " + std::to_string(r));
    const Footprint fp = moe_problem_footprint(p, r, kind, o, sizeof(float));
    CpuDevice dev(64ull << 20);
    // Something else on the device first: the dispatch's peak is its own component's.
    Buffer other = dev.allocate(Component::layer, 1000);
    MoeDispatch d(dev, g, sp.shape, kind, o);
    std::vector<float> y(static_cast<std::size_t>(T * H)), dx(y.size()), dw(static_cast<std::size_t>(T * K)),
        dp(static_cast<std::size_t>(local * EF), 0.0f);
    const float* params = p.params.data() + r * local * EF;
    dev.arena().reset_peaks();
    d.forward(p.x.data() + off * H, T, p.ids.data() + off * K, p.weights.data() + off * K, params, y.data());
    EXPECT_EQ(dev.arena().peak(Component::dispatch), phase_bytes(fp, "forward"));
    dev.arena().reset_peaks();
    d.backward(p.x.data() + off * H, T, p.ids.data() + off * K, p.weights.data() + off * K, params,
               p.dy.data() + off * H, dx.data(), dw.data(), dp.data());
    EXPECT_EQ(dev.arena().peak(Component::dispatch), phase_bytes(fp, "backward"));
    EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
    // The runtime's own sizes give the same footprint.
    const Footprint mine = dispatch_footprint(sp.shape, d.stats().sizes, sizeof(float));
    EXPECT_EQ(phase_bytes(mine, "forward"), phase_bytes(fp, "forward"));
    EXPECT_EQ(phase_bytes(mine, "backward"), phase_bytes(fp, "backward"));
    EXPECT_EQ(fp.device_peak(Component::dispatch), std::max(phase_bytes(fp, "forward"), phase_bytes(fp, "backward")));
    EXPECT_EQ(fp.device_peak(Component::dispatch), dispatch_peak_bytes(sp.shape, d.stats().sizes, sizeof(float)));
    // The budget bounds what PipelinedLLEP holds.
    if (round_bytes && kind == DispatchKind::pipelined_llep) {
      EXPECT_LE(fp.device_peak(Component::dispatch), round_bytes);
    }
  }
}

TEST(MoeDispatchFootprint, MeasuredPeakEqualsFootprintForEverySkewTopKAndCap) {
  for (Skew s : {Skew::uniform, Skew::zipf, Skew::hot, Skew::all_to_one_rank, Skew::one_expert, Skew::source})
    for (std::int64_t k : {1, 2, 4})
      for (std::int64_t cap : {7, 1024}) expect_footprint(s, k, cap, 29);
}

TEST(MoeDispatchFootprint, MeasuredPeakEqualsFootprintUnderARoundBudget) {
  // Budgets from a few copies a round to all at once, with and without a lent-copy bound.
  for (Skew s : {Skew::uniform, Skew::hot, Skew::one_expert, Skew::source})
    for (std::uint64_t budget : {40000ull, 90000ull, 1ull << 24}) {
      expect_footprint(s, 2, 1024, 61, budget);
      expect_footprint(s, 4, 1024, 29, budget, 1);
    }
  expect_footprint(Skew::uniform, 2, 7, 0, 40000);  // no tokens
}

TEST(MoeDispatchFootprint, MeasuredPeakEqualsFootprintWithoutTokens) {
  expect_footprint(Skew::uniform, 2, 7, 0);  // no tokens on any rank
  expect_footprint(Skew::source, 2, 7, 5);   // rank 1 has none (EP > 1)
  expect_footprint(Skew::hot, 4, 1, 3);      // cap 1: a round per copy
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
