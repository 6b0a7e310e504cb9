// MoeDispatch keeps no state between passes (each pass is its own object, moe_dispatch_pass.cc):
// on one dispatch, a problem's forward and backward after another problem's passes (other
// tokens, routing and rounds) are bitwise those of a fresh dispatch, with the same stats and
// no dispatch memory left live. Every kind, at the launched group size, hot skew so LLEP lends.
#include <gtest/gtest.h>

#include <cstring>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/verify/moe_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

struct Outputs {
  std::vector<float> y, dx, dw, dparams;
  DispatchStats forward, backward;
};

Outputs passes(MoeDispatch& d, const MoeProblem& p) {
  Communicator& g = world();
  MoeRankOnDevice on(d.device(), p, g.rank(), g.size());
  Outputs o;
  on.forward(d);
  o.forward = d.stats();
  on.backward(d);
  o.backward = d.stats();
  o.y = on.y(), o.dx = on.dx(), o.dw = on.dw(), o.dparams = on.dparams();
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_stats(const DispatchStats& a, const DispatchStats& b) {
  EXPECT_EQ(a.rounds, b.rounds);
  EXPECT_EQ(a.round_cap, b.round_cap);
  EXPECT_EQ(a.spilled, b.spilled);
  EXPECT_EQ(a.spills, b.spills);
  EXPECT_EQ(a.max_received_rows, b.max_received_rows);
  EXPECT_EQ(a.foreign_experts, b.foreign_experts);
  EXPECT_EQ(a.sizes.max_sent, b.sizes.max_sent);
  EXPECT_EQ(a.sizes.double_buffered, b.sizes.double_buffered);
}

MoeProblem problem(std::int64_t tokens, Skew skew, std::uint64_t seed) {
  MoeProblemSpec s;
  s.shape = MoeShape{12, 10, 12, 2};  // experts divisible by EP in {1, 2, 3, 4}
  s.ranks = world().size();
  s.tokens = tokens;
  s.skew = skew;
  s.seed = seed;
  return make_moe_problem(s);
}

TEST(MoeDispatchPass, PassesKeepNoStateBetweenThem) {
  const MoeProblem a = problem(45, Skew::hot, 5), b = problem(17, Skew::zipf, 6);
  DispatchOptions o;
  o.min_spill = 4;
  o.cap = 7;  // several pipelined rounds for both problems
  for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
    SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " EP=" + std::to_string(world().size()));
    CpuDevice fresh_dev(64ull << 20), dev(64ull << 20);
    MoeDispatch fresh(fresh_dev, world(), a.spec.shape, kind, o), d(dev, world(), a.spec.shape, kind, o);
    const Outputs want = passes(fresh, a);
    if (kind == DispatchKind::pipelined_llep) {
      EXPECT_GT(want.forward.rounds, 1);
    }
    if (kind != DispatchKind::standard_ep && world().size() > 1) {
      EXPECT_TRUE(want.forward.spilled);
    }
    passes(d, b);
    EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
    const Outputs got = passes(d, a);
    EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
    EXPECT_TRUE(same_bits(want.y, got.y));
    EXPECT_TRUE(same_bits(want.dx, got.dx));
    EXPECT_TRUE(same_bits(want.dw, got.dw));
    EXPECT_TRUE(same_bits(want.dparams, got.dparams));
    expect_same_stats(want.forward, got.forward);
    expect_same_stats(want.backward, got.backward);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
