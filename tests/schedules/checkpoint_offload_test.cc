// The checkpointed stack: resident vs SCO bitwise, measured peaks against the
// placement, bytes actually moved, and the checkpointed stack against the plain
// chain of block calls it schedules.
#include "peakbound/schedules/checkpoint_offload.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "peakbound/bench/checkpoint_run.h"
#include "peakbound/core/footprint.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

CheckpointRunConfig small(std::int64_t layers, CheckpointSchedule s, std::int64_t depth = 1,
                          std::optional<std::int64_t> resident = std::nullopt) {
  CheckpointRunConfig c;
  c.layers = layers;
  c.tokens = 48;
  c.hidden = 32;
  c.ffn = 40;
  c.seed = 77;
  c.options.schedule = s;
  c.options.prefetch_depth = depth;
  c.options.resident_layers = resident;
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_bitwise_equal(CheckpointRun& a, CheckpointRun& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.output(), b.output())) << what << ": y";
  EXPECT_TRUE(same_bits(a.input_grad(), b.input_grad())) << what << ": dx";
  EXPECT_TRUE(same_bits(a.param_grads(), b.param_grads())) << what << ": parameter gradients";
}

TEST(CheckpointOffload, ScoIsBitwiseEqualToResidentForAnyLayersDepthAndResidentCount) {
  for (std::int64_t L : {1, 2, 3, 4, 7}) {
    CheckpointRun base(small(L, CheckpointSchedule::resident));
    base.step();
    for (std::int64_t D : {0, 1, 2, 5})
      for (std::int64_t K : {std::int64_t{0}, std::int64_t{1}, L / 2, L}) {
        if (K > L) continue;
        CheckpointRun sco(small(L, CheckpointSchedule::sco, D, K));
        sco.step();
        sco.step();  // a second step reuses the ring and host buffers
        expect_bitwise_equal(base, sco, "L=" + std::to_string(L) + " D=" + std::to_string(D) + " K=" + std::to_string(K));
      }
  }
}

TEST(CheckpointOffload, OrderingHoldsWhenCopiesAreSlowerThanCompute) {
  // An emulated 0.05 GB/s link makes each 6 KiB copy take ~120 us, longer than a block
  // here: any missing wait (a slot rewritten before its D2H, a boundary read before its
  // H2D) would corrupt results.
  for (std::int64_t D : {0, 1, 3}) {
    CheckpointRun base(small(9, CheckpointSchedule::resident));
    CheckpointRunConfig c = small(9, CheckpointSchedule::sco, D, 0);
    c.options.link_gbps = 0.05;
    CheckpointRun sco(c);
    base.step();
    const double seconds = sco.step();
    expect_bitwise_equal(base, sco, "slow link, D=" + std::to_string(D));
    // The step waits for its last prefetch, queued behind every other copy on the one
    // engine, so it cannot be shorter than all bytes at the emulated bandwidth.
    const auto& cs = sco.last_copy_step();
    EXPECT_GE(seconds, static_cast<double>(cs.d2h_bytes + cs.h2d_bytes) / (0.05e9));
    EXPECT_GT(cs.link_wait_seconds, 0.0);
  }
}

TEST(CheckpointOffload, MeasuredPeaksMatchThePlacement) {
  const std::int64_t L = 8;
  CheckpointRun base(small(L, CheckpointSchedule::resident));
  CheckpointRun sco(small(L, CheckpointSchedule::sco, 1, 0));
  CheckpointRun sel(small(L, CheckpointSchedule::sco, 2, 2));
  CheckpointRun one(small(L, CheckpointSchedule::sco, 0, 0));
  base.step();
  sco.step();
  sel.step();
  one.step();
  const std::uint64_t b = arena_reserved(48 * 32 * 4);
  EXPECT_EQ(base.device().arena().peak(Component::checkpoints), L * b);
  EXPECT_EQ(base.host().peak(), 0u);
  // D = 1: a ring of 2, the first 6 boundaries make the host round trip.
  EXPECT_EQ(sco.stack().placement().ring_slots, 2);
  EXPECT_EQ(sco.device().arena().peak(Component::checkpoints), 2 * b);
  EXPECT_EQ(sco.host().peak(Component::checkpoints), 6 * b);
  EXPECT_EQ(sco.device().arena().peak(Component::checkpoints), sco.stack().placement().device_bytes());
  // D = 2, K = 2: 2 resident + a ring of 3; 3 boundaries offloaded.
  EXPECT_EQ(sel.device().arena().peak(Component::checkpoints), 5 * b);
  EXPECT_EQ(sel.host().peak(Component::checkpoints), 3 * b);
  EXPECT_EQ(sel.device().arena().peak(Component::checkpoints), sel.stack().placement().device_bytes());
  // D = 0: one slot; all but the last boundary offloaded, the blocks in place in the slot.
  EXPECT_EQ(one.stack().placement().ring_slots, 1);
  EXPECT_EQ(one.device().arena().peak(Component::checkpoints), b);
  EXPECT_EQ(one.host().peak(Component::checkpoints), 7 * b);
  EXPECT_EQ(one.last_copy_step().d2h_bytes, 7 * 48 * 32 * 4);
  EXPECT_EQ(one.last_copy_step().h2d_bytes, 7 * 48 * 32 * 4);
  // The offloaded boundaries really moved, once each way, and nothing else did.
  const std::uint64_t raw = 48 * 32 * 4;
  EXPECT_EQ(sco.last_copy_step().d2h_bytes, 6 * raw);
  EXPECT_EQ(sco.last_copy_step().h2d_bytes, 6 * raw);
  EXPECT_EQ(base.last_copy_step().d2h_bytes + base.last_copy_step().h2d_bytes, 0u);
  // Everything but the checkpoints is the same in both runs.
  for (Component c : {Component::params, Component::grads, Component::layer})
    EXPECT_EQ(base.device().arena().peak(c), sco.device().arena().peak(c)) << component_name(c);
}

TEST(CheckpointOffload, EverythingResidentIsTheBaseline) {
  CheckpointRun base(small(5, CheckpointSchedule::resident));
  CheckpointRun sco(small(5, CheckpointSchedule::sco, 1, 5));
  base.step();
  sco.step();
  EXPECT_EQ(sco.stack().placement().ring_slots, 0);
  EXPECT_EQ(sco.device().arena().peak(Component::checkpoints), base.device().arena().peak(Component::checkpoints));
  EXPECT_EQ(sco.last_copy_step().d2h_bytes + sco.last_copy_step().h2d_bytes, 0u);
  expect_bitwise_equal(base, sco, "K = L");
}

TEST(CheckpointOffload, StackEqualsThePlainChainOfBlockCalls) {
  // The same blocks called directly, every activation kept, no stack: SCO must not
  // change a bit of what the chain computes.
  const std::int64_t L = 4, T = 48, H = 32;
  CheckpointRun sco(small(L, CheckpointSchedule::sco, 1, 0));
  sco.step();
  CheckpointRun ref(small(L, CheckpointSchedule::resident));  // for its blocks and inputs
  Device& dev = ref.device();
  const std::uint64_t bytes = static_cast<std::uint64_t>(T * H) * 4;
  auto t = [&](const Buffer& b) { return b.tensor(Shape{T, H}, DType::f32); };
  std::vector<Buffer> act;
  act.push_back(dev.allocate(Component::layer, bytes));
  std::memcpy(act[0].data(), ref.input().raw(), bytes);
  for (std::size_t l = 0; l < static_cast<std::size_t>(L); ++l) {
    act.push_back(dev.allocate(Component::layer, bytes));
    ref.blocks()[l]->forward(t(act[l]), t(act[l + 1]));
  }
  Buffer g = dev.allocate(Component::layer, bytes), gnext = dev.allocate(Component::layer, bytes);
  std::memcpy(g.data(), ref.output_grad().raw(), bytes);
  for (std::size_t l = static_cast<std::size_t>(L); l-- > 0;) {
    ref.blocks()[l]->backward(t(act[l]), t(g), t(gnext));
    std::swap(g, gnext);
  }
  const float* y = act.back().as<float>();
  EXPECT_TRUE(same_bits(std::vector<float>(y, y + T * H), sco.output()));
  EXPECT_TRUE(same_bits(std::vector<float>(g.as<float>(), g.as<float>() + T * H), sco.input_grad()));
  EXPECT_TRUE(same_bits(ref.param_grads(), sco.param_grads()));
}

// A block whose forward does not run in place (the wrapped block's does).
class NotInPlace final : public Block {
 public:
  explicit NotInPlace(Block& b) : b_(b) {}
  void forward(const Tensor& x, const Tensor& y) override { b_.forward(x, y); }
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override { b_.backward(x, dy, dx); }
  std::vector<Parameter> parameters() const override { return b_.parameters(); }
  void zero_grad() override { b_.zero_grad(); }

 private:
  Block& b_;
};

TEST(CheckpointOffload, AOneSlotRingNeedsBlocksThatRunInPlace) {
  CheckpointRun run(small(3, CheckpointSchedule::sco, 0, 0));
  NotInPlace a(*run.blocks()[0]), b(*run.blocks()[1]), c(*run.blocks()[2]);
  const CheckpointOptions o = run.config().options;
  try {
    CheckpointedStack s(run.device(), run.host(), {&a, &b, &c}, Shape{48, 32}, DType::f32, o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block 0's does not"), std::string::npos) << e.what();
  }
  // The last block writes the stack's output, never in place; one resident boundary
  // (K = 1) leaves block 1 writing it outside the ring: only block 0 must run in place.
  CheckpointOptions k1 = o;
  k1.resident_layers = 1;
  EXPECT_THROW(CheckpointedStack(run.device(), run.host(), {&a, &b, &c}, Shape{48, 32}, DType::f32, k1),
               InvalidArgument);
  EXPECT_NO_THROW(CheckpointedStack(run.device(), run.host(), {run.blocks()[0].get(), &b, &c}, Shape{48, 32},
                                    DType::f32, k1));
  CheckpointOptions d1 = o;
  d1.prefetch_depth = 1;
  EXPECT_NO_THROW(CheckpointedStack(run.device(), run.host(), {&a, &b, &c}, Shape{48, 32}, DType::f32, d1));
}

// Checkpoint groups (CheckpointOptions::group_layers): one boundary per group of G blocks,
// the group's other inputs recomputed in its backward. Every L, G, depth and resident count:
// bitwise the resident baseline's output, dx and gradients, over two steps.
TEST(CheckpointOffload, GroupsAreBitwiseTheBaselineForAnyLayersGroupDepthAndResidentCount) {
  for (std::int64_t L : {1, 2, 3, 5, 7}) {
    CheckpointRun base(small(L, CheckpointSchedule::resident));
    base.step();
    for (std::int64_t G : {2, 3, 4, 8})
      for (std::int64_t D : {0, 1, 2}) {
        const std::int64_t n = checkpoint_group_count(L, G);
        for (std::int64_t K : {std::int64_t{0}, std::int64_t{1}, n}) {
          if (K > n) continue;
          CheckpointRunConfig c = small(L, CheckpointSchedule::sco, D, K);
          c.options.group_layers = G;
          CheckpointRun sco(c);
          sco.step();
          sco.step();
          expect_bitwise_equal(base, sco, "L=" + std::to_string(L) + " G=" + std::to_string(G) + " D=" +
                                              std::to_string(D) + " K=" + std::to_string(K));
          EXPECT_EQ(sco.stack().placement().layers, n);
        }
      }
    CheckpointRunConfig r = small(L, CheckpointSchedule::resident);
    r.options.group_layers = 3;
    CheckpointRun res(r);
    res.step();
    expect_bitwise_equal(base, res, "resident, G=3, L=" + std::to_string(L));
  }
}

// The groups' shape (the last full, the first the remainder) and what a stack of 8 blocks in
// groups of 3 holds: 3 boundaries (blocks 0, 2 and 5), of which one on the device with a
// one-slot ring and 2 on the host, and in backward up to 2 recomputed inputs beside them:
// the measured peaks equal checkpoint_footprint and the bytes moved the offloaded ones.
TEST(CheckpointOffload, GroupsHoldOneBoundaryPerGroupAndRecomputeTheRest) {
  EXPECT_EQ(checkpoint_group_count(8, 3), 3);
  EXPECT_EQ(checkpoint_group(8, 3, 0).first, 0);
  EXPECT_EQ(checkpoint_group(8, 3, 0).count, 2);
  EXPECT_EQ(checkpoint_group(8, 3, 1).first, 2);
  EXPECT_EQ(checkpoint_group(8, 3, 2).first, 5);
  EXPECT_EQ(checkpoint_group(8, 3, 2).count, 3);
  EXPECT_EQ(checkpoint_group_count(2, 5), 1);
  EXPECT_EQ(checkpoint_group(2, 5, 0).count, 2);
  EXPECT_THROW(checkpoint_group(8, 3, 3), InvalidArgument);
  EXPECT_THROW(checkpoint_group_count(8, 0), InvalidArgument);

  const std::uint64_t b = arena_reserved(48 * 32 * 4), raw = 48 * 32 * 4;
  for (std::int64_t D : {0, 1}) {
    SCOPED_TRACE("D = " + std::to_string(D));
    CheckpointRunConfig c = small(8, CheckpointSchedule::sco, D, 0);
    c.options.group_layers = 3;
    CheckpointRun run(c);
    run.step();
    const CheckpointBuffers& cb = run.stack().buffers();
    EXPECT_EQ(cb.recompute, 2);
    EXPECT_EQ(cb.placement.layers, 3);
    EXPECT_EQ(cb.placement.ring_slots, D + 1);
    const Footprint f = checkpoint_footprint(cb);
    EXPECT_EQ(run.device().arena().peak(Component::checkpoints), f.device_peak(Component::checkpoints));
    EXPECT_EQ(run.device().arena().peak(Component::checkpoints), static_cast<std::uint64_t>(D + 1 + 2) * b);
    EXPECT_EQ(run.host().peak(Component::checkpoints), f.host_peak(Component::checkpoints));
    EXPECT_EQ(run.host().peak(Component::checkpoints), static_cast<std::uint64_t>(2 - D) * b);
    EXPECT_EQ(run.last_copy_step().d2h_bytes, static_cast<std::uint64_t>(2 - D) * raw);
    EXPECT_EQ(run.last_copy_step().h2d_bytes, static_cast<std::uint64_t>(2 - D) * raw);
    EXPECT_EQ(run.device().arena().live(Component::checkpoints), static_cast<std::uint64_t>(D + 1) * b);
  }
}

// A block counting its forwards and recomputations (the wrapped block does the work).
class Counting final : public Block {
 public:
  explicit Counting(Block& b) : b_(b) {}
  void forward(const Tensor& x, const Tensor& y) override {
    ++forwards;
    b_.forward(x, y);
  }
  void forward_recompute(const Tensor& x, const Tensor& y) override {
    ++recomputes;
    b_.forward(x, y);
  }
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override { b_.backward(x, dy, dx); }
  bool forward_in_place() const override { return b_.forward_in_place(); }
  std::vector<Parameter> parameters() const override { return b_.parameters(); }
  void zero_grad() override { b_.zero_grad(); }
  int forwards = 0, recomputes = 0;

 private:
  Block& b_;
};

// A group's backward recomputes the inputs of its blocks but the first through
// forward_recompute, once a step: blocks 0 and 1 (group 0 of 2) and 2, 3 (group 1 of 3) of
// 5 in groups of 3; the last block of each group is never recomputed. A group's blocks
// after its first must run in place.
TEST(CheckpointOffload, AGroupRecomputesItsInnerInputsOnceAStep) {
  CheckpointRun run(small(5, CheckpointSchedule::sco, 1, 0));
  std::vector<std::unique_ptr<Counting>> c;
  std::vector<Block*> blocks;
  for (auto& b : run.blocks()) {
    c.push_back(std::make_unique<Counting>(*b));
    blocks.push_back(c.back().get());
  }
  CheckpointOptions o = run.config().options;
  o.group_layers = 3;
  CheckpointedStack s(run.device(), run.host(), blocks, Shape{48, 32}, DType::f32, o);
  s.forward(run.input(), run.device().allocate(Component::layer, 48 * 32 * 4).tensor(Shape{48, 32}, DType::f32));
  Buffer dx = run.device().allocate(Component::layer, 48 * 32 * 4);
  s.backward(run.output_grad(), dx.tensor(Shape{48, 32}, DType::f32));
  const std::vector<int> recomputed = {1, 0, 1, 1, 0};
  for (std::size_t l = 0; l < c.size(); ++l) {
    EXPECT_EQ(c[l]->forwards, 1) << "block " << l;
    EXPECT_EQ(c[l]->recomputes, recomputed[l]) << "block " << l;
  }
  NotInPlace a(*run.blocks()[0]), b(*run.blocks()[1]);
  try {
    CheckpointedStack bad(run.device(), run.host(), {&a, &b}, Shape{48, 32}, DType::f32, o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("group_layers 3 needs blocks whose forward runs in place; block 1's"),
              std::string::npos)
        << e.what();
  }
  o.group_layers = 0;
  EXPECT_THROW(CheckpointedStack(run.device(), run.host(), blocks, Shape{48, 32}, DType::f32, o), InvalidArgument);
}

// The one-slot ring's slot parked between forward and backward (park_slot, what the
// trainer does across its loss): the device holds no boundary while parked, backward
// brings the slot's boundary back, and the step is bitwise the unparked one's; a second
// step reuses everything. Refused outside forward..backward, twice, or with two slots.
TEST(CheckpointOffload, AParkedSlotChangesNoBit) {
  const std::int64_t T = 48, H = 32;
  for (std::int64_t K : {0, 1}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    CheckpointRun run(small(4, CheckpointSchedule::sco, 0, K));
    run.step();
    const std::vector<float> y0 = run.output(), dx0 = run.input_grad(), g0 = run.param_grads();
    Device& dev = run.device();
    const std::uint64_t bytes = static_cast<std::uint64_t>(T * H) * 4;
    Buffer y = dev.allocate(Component::layer, bytes), dx = dev.allocate(Component::layer, bytes);
    Buffer parked = run.host().allocate(Component::checkpoints, bytes);
    const Shape s{T, H};
    EXPECT_THROW(run.stack().park_slot(parked.data()), InvalidArgument);  // no forward yet
    for (int step = 0; step < 2; ++step) {
      for (auto& b : run.blocks()) b->zero_grad();
      run.stack().forward(run.input(), y.tensor(s, DType::f32));
      const std::uint64_t held = dev.arena().live(Component::checkpoints);
      run.stack().park_slot(parked.data());
      EXPECT_EQ(dev.arena().live(Component::checkpoints), held - arena_reserved(bytes));  // only residents left
      EXPECT_THROW(run.stack().park_slot(parked.data()), InvalidArgument);               // parked already
      run.stack().backward(run.output_grad(), dx.tensor(s, DType::f32));
      dev.synchronize();
      EXPECT_TRUE(same_bits(std::vector<float>(y.as<float>(), y.as<float>() + T * H), y0));
      EXPECT_TRUE(same_bits(std::vector<float>(dx.as<float>(), dx.as<float>() + T * H), dx0));
      EXPECT_TRUE(same_bits(run.param_grads(), g0));
    }
  }
  CheckpointRun two(small(3, CheckpointSchedule::sco, 1, 0));
  two.step();
  Buffer y = two.device().allocate(Component::layer, 48 * 32 * 4);
  Buffer parked = two.host().allocate(Component::checkpoints, 48 * 32 * 4);
  two.stack().forward(two.input(), y.tensor(Shape{48, 32}, DType::f32));
  EXPECT_THROW(two.stack().park_slot(parked.data()), InvalidArgument);  // a ring of two
}

TEST(CheckpointOffload, BadOptionsAreUserErrors) {
  EXPECT_THROW(CheckpointRun(small(4, CheckpointSchedule::sco, -1)), InvalidArgument);
  EXPECT_THROW(CheckpointRun(small(4, CheckpointSchedule::sco, 1, 5)), InvalidArgument);
  CheckpointRunConfig c = small(4, CheckpointSchedule::sco);
  c.options.link_gbps = -1;
  EXPECT_THROW(CheckpointRun{c}, InvalidArgument);
  c = small(0, CheckpointSchedule::sco);
  EXPECT_THROW(CheckpointRun{c}, InvalidArgument);
  // A checkpoint budget below the ring is refused before any step, naming the fix.
  c = small(8, CheckpointSchedule::sco, 1);
  c.options.checkpoint_budget = arena_reserved(48 * 32 * 4);
  try {
    CheckpointRun r(c);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("ring of 2"), std::string::npos) << e.what();
  }
}

TEST(CheckpointOffload, ScoTrainsInADeviceBudgetTheBaselineCannot) {
  CheckpointRun base(small(8, CheckpointSchedule::resident));
  CheckpointRun sco(small(8, CheckpointSchedule::sco, 1, 0));
  base.step();
  sco.step();
  const std::uint64_t pb = base.device().arena().peak(), ps = sco.device().arena().peak();
  ASSERT_LT(ps, pb);
  // A budget between the two peaks: the baseline runs out naming the checkpoints, SCO fits.
  CheckpointRunConfig c = small(8, CheckpointSchedule::resident);
  c.device_memory = (ps + pb) / 2;
  try {
    CheckpointRun r(c);
    r.step();
    FAIL() << "expected the resident baseline to exceed " << *c.device_memory << " bytes";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoints"), std::string::npos) << e.what();
  }
  c.options = sco.config().options;
  CheckpointRun fits(c);
  fits.step();
  expect_bitwise_equal(base, fits, "tight budget");
}

TEST(CheckpointOffload, TheBudgetPolicyKeepsTheLastLayersResident) {
  CheckpointRunConfig c = small(8, CheckpointSchedule::sco, 1);
  const std::uint64_t b = arena_reserved(48 * 32 * 4);
  c.options.checkpoint_budget = 5 * b + b / 2;  // room for 5 boundaries: the ring of 2 and 3 resident
  CheckpointRun r(c);
  r.step();
  EXPECT_EQ(r.stack().placement().resident, 3);
  EXPECT_EQ(r.device().arena().peak(Component::checkpoints), 5 * b);
  CheckpointRun base(small(8, CheckpointSchedule::resident));
  base.step();
  expect_bitwise_equal(base, r, "budget policy");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
