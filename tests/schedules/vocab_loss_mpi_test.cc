// Ring-DTP and the materialized baseline against a naive double-precision reference,
// at whatever group size the binary was launched with (1 without mpirun; 2, 3, 4 under
// mpirun): both ring modes, auto, odd vocabulary and chunk sizes, uneven token counts,
// ignore_index, z-loss, and a rank with no valid target. Also the peak claim itself:
// Ring-DTP's vocab peak has no tokens x vocabulary term, the baseline's does.
// forward_backward: Ring-DTP's fused form at P = 1 (the old path at P > 1) and the
// baseline's default (forward + backward), against the reference and each other.
#include <gtest/gtest.h>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/vocab_footprint.h"
#include "peakbound/verify/vocab_reference.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

struct Case {
  std::int64_t base_tokens, hidden, vocab, chunk;
  bool uneven;
  double ignore;
  float z;
  int all_ignored_rank;
};

VocabProblemSpec spec_for(const Case& c, int P, std::uint64_t seed) {
  VocabProblemSpec s;
  for (int r = 0; r < P; ++r) s.tokens.push_back(c.base_tokens + (c.uneven ? 5 * r : 0));
  s.hidden = c.hidden;
  s.vocab = c.vocab;
  s.ignore_fraction = c.ignore;
  s.all_ignored_rank = c.all_ignored_rank;
  s.seed = seed;
  return s;
}

void run_case(const Case& c) {
  Communicator& g = world();
  VocabLossOptions o;
  const VocabDims d{c.vocab, c.hidden};
  o.chunk = c.chunk;
  o.z_loss = c.z;
  VocabProblem p = make_vocab_problem(spec_for(c, g.size(), 42 + static_cast<std::uint64_t>(c.vocab)), o.ignore_index);
  const float scale = 0.37f;
  VocabReference ref = naive_vocab_reference(p, o, scale);
  CpuDevice dev(512ull << 20);
  struct Impl {
    const char* name;
    RingMode mode;
    bool ring;
  };
  for (Impl impl : {Impl{"materialized", RingMode::automatic, false}, Impl{"ring auto", RingMode::automatic, true},
                    Impl{"ring activations", RingMode::activations, true}, Impl{"ring weights", RingMode::weights, true}}) {
    o.mode = impl.mode;
    auto loss = impl.ring ? make_ring_dtp_vocab_loss(dev, g, d, o) : make_materialized_vocab_loss(dev, g, d, o);
    VocabCheck chk = check_vocab_loss(*loss, g, p, ref, scale);
    SCOPED_TRACE(std::string(impl.name) + " P=" + std::to_string(g.size()) + " V=" + std::to_string(c.vocab) +
                 " chunk=" + std::to_string(c.chunk) + " z=" + std::to_string(c.z));
    EXPECT_TRUE(chk.count_matches) << chk.count << " vs " << ref.count;
    EXPECT_LT(chk.rel_err_loss, 1e-5);
    EXPECT_LT(chk.rel_err_dhidden, 1e-5);
    EXPECT_LT(chk.rel_err_dweight, 1e-5);
    EXPECT_EQ(dev.arena().live(), 0u) << "scratch must be released after backward";
  }
}

TEST(VocabLoss, MatchesNaiveReferencePlain) { run_case({40, 16, 97, 8, false, 0.0, 0.0f, -1}); }

TEST(VocabLoss, OddVocabUnevenTokensIgnoreAndZLoss) { run_case({33, 12, 1001, 7, true, 0.2, 1e-3f, -1}); }

TEST(VocabLoss, ARankWithNoValidTarget) { run_case({21, 8, 64, 5, true, 0.1, 1e-4f, 0}); }

TEST(VocabLoss, VocabularySmallerThanTheGroup) { run_case({9, 8, 3, 4, false, 0.0, 0.0f, -1}); }

TEST(VocabLoss, ChunkLargerThanTokens) { run_case({6, 8, 50, 1000, true, 0.0, 0.0f, -1}); }

TEST(VocabLoss, RingPeakHasNoTokensTimesVocabTerm) {
  Communicator& g = world();
  VocabLossOptions o;
  const VocabDims d{4096, 32};
  o.chunk = 64;
  o.mode = RingMode::weights;
  std::uint64_t ring_peak[2], base_peak[2];
  for (int i = 0; i < 2; ++i) {
    Case c{256 << (2 * i), 32, 4096, 64, false, 0.0, 0.0f, -1};  // 256 then 1024 tokens per rank
    VocabProblem p = make_vocab_problem(spec_for(c, g.size(), 7), o.ignore_index);
    const std::int64_t T = c.base_tokens, off = p.offset(g.rank());
    VocabShard sh = vocab_shard(d.vocab, g.size(), g.rank());
    std::vector<float> dh(static_cast<std::size_t>(T * d.hidden)), dw(static_cast<std::size_t>(sh.rows * d.hidden));
    for (bool ring : {true, false}) {
      CpuDevice dev(512ull << 20);
      auto loss = ring ? make_ring_dtp_vocab_loss(dev, g, d, o) : make_materialized_vocab_loss(dev, g, d, o);
      loss->forward(p.hidden.data() + off * d.hidden, p.targets.data() + off, T, p.weight.data() + sh.offset * d.hidden);
      loss->backward(1.0f, dh.data(), dw.data());
      (ring ? ring_peak : base_peak)[i] = dev.arena().peak(Component::vocab);
    }
  }
  // What may grow with the tokens is per-token state only: the saved log-sum-exp and the
  // running max/sum/target logit, 16 bytes a token (+ one alignment unit per buffer),
  // never a tokens x vocabulary term.
  const std::uint64_t more_tokens = 1024 - 256;
  EXPECT_LE(ring_peak[1] - ring_peak[0], 16 * more_tokens + 2 * 256) << ring_peak[0] << " -> " << ring_peak[1];
  EXPECT_GT(base_peak[1], 3 * base_peak[0]) << "the baseline's logits grow with the tokens";
  EXPECT_LT(ring_peak[1], base_peak[1]);
}

// Through forward_backward: Ring-DTP fuses at P = 1 only, and at every P matches the
// reference and the baseline (also through forward_backward, its default form).
void run_step_case(const Case& c) {
  Communicator& g = world();
  VocabLossOptions o;
  const VocabDims d{c.vocab, c.hidden};
  o.chunk = c.chunk;
  o.z_loss = c.z;
  VocabProblem p = make_vocab_problem(spec_for(c, g.size(), 99 + static_cast<std::uint64_t>(c.vocab)), o.ignore_index);
  const float scale = 0.37f;
  VocabReference ref = naive_vocab_reference(p, o, scale);
  CpuDevice dev(512ull << 20);
  for (RingMode mode : {RingMode::automatic, RingMode::weights, RingMode::activations}) {
    o.mode = mode;
    auto ring = make_ring_dtp_vocab_loss(dev, g, d, o);
    auto base = make_materialized_vocab_loss(dev, g, d, o);
    SCOPED_TRACE("P=" + std::to_string(g.size()) + " T=" + std::to_string(c.base_tokens) + " V=" +
                 std::to_string(c.vocab) + " chunk=" + std::to_string(c.chunk) + " z=" + std::to_string(c.z) +
                 " mode=" + std::string(ring_mode_name(mode)));
    for (VocabLoss* loss : {ring.get(), base.get()}) {
      SCOPED_TRACE(loss->name());
      VocabCheck chk = check_vocab_loss_step(*loss, g, p, ref, scale);
      EXPECT_TRUE(chk.count_matches) << chk.count << " vs " << ref.count;
      EXPECT_LT(chk.rel_err_loss, 1e-5);
      EXPECT_LT(chk.rel_err_dhidden, 1e-5);
      EXPECT_LT(chk.rel_err_dweight, 1e-5);
      EXPECT_EQ(dev.arena().live(), 0u) << "forward_backward keeps nothing";
    }
    if (g.size() == 1) {
      EXPECT_EQ(ring->mode_used(), "fused");
      const std::int64_t blocks = (c.base_tokens + c.chunk - 1) / c.chunk;
      EXPECT_EQ(ring->stats().gemm_calls, blocks * (c.ignore < 1.0 ? 3 : 1))
          << "3 GEMMs a block (only the logits when every target is ignored)";
    } else {
      EXPECT_NE(ring->mode_used(), "fused") << "a group of several ranks keeps the ring";
    }
    // The two entry points agree on this rank's loss (forward + backward after the step).
    VocabCheck again = check_vocab_loss(*ring, g, p, ref, scale);
    EXPECT_LT(again.rel_err_loss, 1e-5);
    EXPECT_NE(ring->mode_used(), "fused");
  }
}

TEST(VocabLoss, StepMatchesReferenceChunkNotDividingTokens) { run_step_case({37, 12, 97, 8, false, 0.1, 0.0f, -1}); }

TEST(VocabLoss, StepOneToken) { run_step_case({1, 8, 50, 4, false, 0.0, 0.0f, -1}); }

TEST(VocabLoss, StepOddVocabUnevenTokensZLoss) { run_step_case({33, 12, 1001, 7, true, 0.2, 1e-3f, -1}); }

TEST(VocabLoss, StepEveryTargetIgnored) { run_step_case({19, 8, 61, 5, true, 1.0, 1e-3f, -1}); }

TEST(VocabLoss, StepChunkLargerThanTokens) { run_step_case({6, 8, 50, 1000, true, 0.0, 0.0f, -1}); }

TEST(VocabLoss, FusedPeakIsOneBlockWhateverTheTokens) {
  Communicator& g = world();
  if (g.size() != 1) GTEST_SKIP() << "the fused form is the one-rank group's";
  VocabLossOptions o;
  o.chunk = 64;
  const VocabDims d{4096, 32};
  std::uint64_t peak[2];
  for (int i = 0; i < 2; ++i) {
    Case c{256 << (2 * i), 32, 4096, 64, false, 0.0, 0.0f, -1};
    VocabProblem p = make_vocab_problem(spec_for(c, 1, 7), o.ignore_index);
    std::vector<float> dh(p.hidden.size()), dw(p.weight.size(), 0.0f);
    CpuDevice dev(512ull << 20);
    auto loss = make_ring_dtp_vocab_loss(dev, g, d, o);
    loss->forward_backward(p.hidden.data(), p.targets.data(), c.base_tokens, p.weight.data(), 1.0f, dh.data(),
                           dw.data());
    peak[i] = dev.arena().peak(Component::vocab);
  }
  EXPECT_EQ(peak[0], peak[1]) << "256 and 1024 tokens";
  EXPECT_EQ(peak[0], arena_reserved(64u * 4096 * sizeof(float)));
}

TEST(VocabLoss, OutOfRangeTargetIsAnErrorOnEveryRank) {
  Communicator& g = world();
  VocabLossOptions o;
  const VocabDims d{10, 4};
  CpuDevice dev(64ull << 20);
  std::vector<float> h(8, 1.0f), w(static_cast<std::size_t>(vocab_shard(10, g.size(), g.rank()).rows * 4), 0.5f);
  std::vector<std::int32_t> t = {1, g.rank() == 0 ? 10 : 2};
  auto loss = make_ring_dtp_vocab_loss(dev, g, d, o);
  EXPECT_THROW(loss->forward(h.data(), t.data(), 2, w.data()), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
