// MoeDispatch keeps no state between passes (each pass is its own object, moe_dispatch_pass.cc):
// on one dispatch, a problem's forward and backward after another problem's passes (other
// tokens, routing and rounds) are bitwise those of a fresh dispatch, with the same stats and
// no dispatch memory left live. Every kind, at the launched group size, hot skew so LLEP lends.
// And a forward that keeps its experts' intermediates (MoeDispatch's `kept`) gives a
// backward that runs no expert forward the same bits as one that does.
#include <gtest/gtest.h>

#include <cstring>

#include "peakbound/core/error.h"
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

// (Empty on a rank without tokens: no memcmp of null pointers.)
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
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

// The kept experts (MoeDispatch's `kept`): the forward's y and the backward's dx, routing
// weight and expert gradients bitwise those of the passes that compute the experts'
// forward again, for every kind (several pipelined rounds, LLEP lending under hot skew),
// a rank without tokens (source skew), every copy to one expert and a single token
// (most experts empty); the store is dispatch_kept_buffer of the rows the rank computed,
// the only dispatch memory live between the passes, and the backward leaves none.
TEST(MoeDispatchPass, KeptExpertsAreTheRecomputedOnesBitForBit) {
  DispatchOptions o;
  o.min_spill = 4;
  o.cap = 7;
  struct Case {
    std::int64_t tokens;
    Skew skew;
  };
  for (const Case c : {Case{45, Skew::hot}, Case{23, Skew::source}, Case{19, Skew::one_expert}, Case{1, Skew::zipf}}) {
    const MoeProblem p = problem(c.tokens, c.skew, 9);
    for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
      SCOPED_TRACE(std::string(dispatch_kind_name(kind)) + " skew " + std::string(skew_name(c.skew)) + " tokens " +
                   std::to_string(c.tokens) + " EP=" + std::to_string(world().size()));
      CpuDevice dev_a(64ull << 20), dev_b(64ull << 20);
      MoeDispatch a(dev_a, world(), p.spec.shape, kind, o), b(dev_b, world(), p.spec.shape, kind, o);
      const Outputs want = passes(a, p);
      MoeRankOnDevice on(dev_b, p, world().rank(), world().size());
      Buffer kept;
      on.forward(b, &kept);
      const DispatchStats st = b.stats();
      EXPECT_EQ(kept.bytes(), dispatch_kept_buffer(p.spec.shape, st.sizes.computed, Precision::f32).reserved());
      EXPECT_EQ(dev_b.arena().live(Component::dispatch), kept.bytes());
      EXPECT_EQ(st.sizes.computed, want.forward.sizes.computed);
      on.backward(b, &kept);
      kept.reset();
      EXPECT_EQ(dev_b.arena().live(Component::dispatch), 0u);
      EXPECT_TRUE(same_bits(want.y, on.y()));
      EXPECT_TRUE(same_bits(want.dx, on.dx()));
      EXPECT_TRUE(same_bits(want.dw, on.dw()));
      EXPECT_TRUE(same_bits(want.dparams, on.dparams()));
    }
  }
  // The group computes every copy once: the ranks' computed rows sum to the copies.
  const MoeProblem p = problem(31, Skew::hot, 4);
  CpuDevice dev(64ull << 20);
  MoeDispatch d(dev, world(), p.spec.shape, DispatchKind::llep, o);
  const Outputs out = passes(d, p);
  std::int64_t rows = out.forward.sizes.computed, copies = 0;
  for (int r = 0; r < world().size(); ++r) copies += p.tokens[static_cast<std::size_t>(r)] * p.spec.shape.top_k;
  world().all_reduce(&rows, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(rows, copies);
  // A store that is not this routing's (one rank: no other rank waits in a collective).
  if (world().size() == 1) {
    const MoeProblem q = problem(12, Skew::uniform, 8);
    MoeRankOnDevice on(dev, p, 0, 1), other(dev, q, 0, 1);
    Buffer kept;
    other.forward(d, &kept);
    EXPECT_THROW(on.backward(d, &kept), InternalError);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
