// The vocabulary loss's footprints against the Arena: for a grid of shapes (uneven
// token counts, a rank with no tokens, V not divisible by P, V < P, chunks that do not
// divide T) and every implementation (materialized; Ring-DTP auto, activations,
// weights), the measured Component::vocab peak of forward (from an empty arena), what
// forward leaves for backward, and the peak of backward (after reset_peaks) equal the
// footprint's "forward", "saved" and "backward" phases exactly (the footprint counts
// reserved bytes, i.e. the Arena's 256-byte rounding, so equality is exact), and the
// result still matches the naive reference. Runs at whatever group size it was
// launched with (1-4 ranks under ctest).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/verify/vocab_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

struct Shape {
  const char* name;
  std::function<std::int64_t(int rank, int ranks)> tokens;
};

std::uint64_t vocab_bytes(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::vocab)];
}

void check_grid(std::int64_t vocab, std::int64_t hidden, const std::vector<std::int64_t>& chunks) {
  Communicator& g = world();
  const int P = g.size(), r = g.rank();
  const std::vector<Shape> shapes = {
      {"uniform 37", [](int, int) { return 37; }},
      {"uneven 13+7r", [](int rank, int) { return 13 + 7 * rank; }},
      {"last rank empty", [](int rank, int ranks) { return rank == ranks - 1 ? 0 : 19 + rank; }},
      {"first rank empty", [](int rank, int) { return rank == 0 ? 0 : 11; }},
  };
  for (const Shape& sh : shapes) {
    VocabProblemSpec spec;
    for (int i = 0; i < P; ++i) spec.tokens.push_back(sh.tokens(i, P));
    spec.hidden = hidden;
    spec.vocab = vocab;
    spec.ignore_fraction = 0.1;
    spec.seed = 5 + static_cast<std::uint64_t>(vocab);
    VocabLossOptions o;
    VocabProblem p = make_vocab_problem(spec, o.ignore_index);
    const float scale = 0.5f;
    VocabReference ref = naive_vocab_reference(p, o, scale);
    VocabLossShape shape;
    shape.tokens = spec.tokens;
    shape.dims = VocabDims{vocab, hidden};
    shape.rank = r;
    for (std::int64_t chunk : chunks) {
      o.chunk = chunk;
      struct Impl {
        const char* name;
        bool ring;
        RingMode mode;
      };
      for (Impl impl : {Impl{"materialized", false, RingMode::automatic}, Impl{"ring auto", true, RingMode::automatic},
                        Impl{"ring activations", true, RingMode::activations},
                        Impl{"ring weights", true, RingMode::weights}}) {
        o.mode = impl.mode;
        SCOPED_TRACE(std::string(impl.name) + " P=" + std::to_string(P) + " rank=" + std::to_string(r) + " V=" +
                     std::to_string(vocab) + " H=" + std::to_string(hidden) + " chunk=" + std::to_string(chunk) +
                     " tokens: " + sh.name);
        const Footprint fp = impl.ring ? ring_dtp_footprint(shape, o, sizeof(float))
                                       : materialized_vocab_footprint(shape, o, sizeof(float));
        CpuDevice dev(64ull << 20);
        auto loss = impl.ring ? make_ring_dtp_vocab_loss(dev, g, shape.dims, o)
                              : make_materialized_vocab_loss(dev, g, shape.dims, o);
        Arena& a = dev.arena();
        a.reset_peaks();
        std::uint64_t fwd = 0, saved = 0;
        VocabCheck chk = check_vocab_loss(*loss, g, p, ref, scale, [&] {
          fwd = a.peak(Component::vocab);
          saved = a.live(Component::vocab);
          a.reset_peaks();
        });
        const std::uint64_t bwd = a.peak(Component::vocab);
        EXPECT_EQ(fwd, vocab_bytes(fp, "forward"));
        EXPECT_EQ(saved, vocab_bytes(fp, "saved"));
        EXPECT_EQ(bwd, vocab_bytes(fp, "backward"));
        EXPECT_EQ(std::max(fwd, bwd), fp.device_peak(Component::vocab));
        EXPECT_EQ(a.live(Component::vocab), 0u) << "scratch must be released after backward";
        if (impl.ring) {
          EXPECT_EQ(loss->mode_used(), ring_mode_name(ring_dtp_mode(shape, o)));
        }
        EXPECT_TRUE(chk.count_matches) << chk.count << " vs " << ref.count;
        EXPECT_LT(chk.rel_err_loss, 1e-5);
        EXPECT_LT(chk.rel_err_dhidden, 1e-5);
        EXPECT_LT(chk.rel_err_dweight, 1e-5);
      }
    }
  }
}

// Ring-DTP through forward_backward: the measured peak of the whole step equals
// ring_dtp_step_footprint's (the fused form's one block at P = 1, the ring's phases at
// P > 1), nothing stays held, and the result matches the reference.
void check_step_grid(std::int64_t vocab, std::int64_t hidden, const std::vector<std::int64_t>& chunks) {
  Communicator& g = world();
  const int P = g.size(), r = g.rank();
  for (std::int64_t base : {0, 1, 37}) {
    VocabProblemSpec spec;
    for (int i = 0; i < P; ++i) spec.tokens.push_back(base + 3 * i);
    spec.hidden = hidden;
    spec.vocab = vocab;
    spec.ignore_fraction = 0.1;
    spec.seed = 11 + static_cast<std::uint64_t>(vocab);
    VocabLossOptions o;
    o.z_loss = 1e-3f;
    VocabProblem p = make_vocab_problem(spec, o.ignore_index);
    const float scale = 0.5f;
    VocabReference ref = naive_vocab_reference(p, o, scale);
    VocabLossShape shape;
    shape.tokens = spec.tokens;
    shape.dims = VocabDims{vocab, hidden};
    shape.rank = r;
    for (std::int64_t chunk : chunks) {
      o.chunk = chunk;
      SCOPED_TRACE("step P=" + std::to_string(P) + " rank=" + std::to_string(r) + " V=" + std::to_string(vocab) +
                   " chunk=" + std::to_string(chunk) + " base tokens=" + std::to_string(base));
      const Footprint fp = ring_dtp_step_footprint(shape, o, sizeof(float));
      EXPECT_EQ(fp.has_phase("forward_backward"), P == 1);
      CpuDevice dev(64ull << 20);
      auto loss = make_ring_dtp_vocab_loss(dev, g, shape.dims, o);
      dev.arena().reset_peaks();
      VocabCheck chk = check_vocab_loss_step(*loss, g, p, ref, scale);
      EXPECT_EQ(dev.arena().peak(Component::vocab), fp.device_peak(Component::vocab));
      EXPECT_EQ(dev.arena().live(Component::vocab), 0u);
      EXPECT_EQ(loss->mode_used() == "fused", P == 1);
      EXPECT_TRUE(chk.count_matches) << chk.count << " vs " << ref.count;
      EXPECT_LT(chk.rel_err_loss, 1e-5);
      EXPECT_LT(chk.rel_err_dhidden, 1e-5);
      EXPECT_LT(chk.rel_err_dweight, 1e-5);
    }
  }
}

TEST(VocabFootprint, MeasuredEqualsStepFootprint) {
  check_step_grid(97, 12, {5, 8, 1000});
  check_step_grid(2, 8, {3});
}

// 97 is prime: not divisible by 2, 3 or 4; chunks 5 and 8 divide none of the counts.
TEST(VocabFootprint, MeasuredEqualsFootprintOddVocab) { check_grid(97, 12, {5, 8, 1000}); }

// Fewer rows than ranks at P = 3, 4 (a rank holds no vocabulary rows).
TEST(VocabFootprint, MeasuredEqualsFootprintVocabSmallerThanGroup) { check_grid(2, 8, {3, 64}); }

// Few tokens against many rows: auto picks activations; a chunk of 1 is the extreme.
TEST(VocabFootprint, MeasuredEqualsFootprintLargeVocab) { check_grid(1001, 8, {1, 7}); }

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
