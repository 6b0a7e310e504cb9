// Context parallelism changes where tokens live, never the math: on the same global
// batch, a training step with the sequences split over cp ranks (zigzag shards, ring
// attention, RoPE at global positions, the dispatch, the vocabulary loss and the
// checkpoint boundaries on local tokens) gives the loss and every gradient of the step
// with cp = 1 (whole sequences per rank) to 1e-5 relative, and five optimizer steps
// the same loss curve (on one batch repeated, so that it falls). Every cp > 1 dividing the world (2 ranks: 2; 3: 3; 4: 2 and 4),
// with every schedule on and off, on lengths the 2 cp chunks do not divide evenly.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/trainer.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

ModelConfig cp_config() { return testing::small_train_config("cp-test"); }

ModelSchedules schedules(bool all) {
  ModelSchedules s;
  s.dispatch = all ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
  s.dispatch_options.cap = 5;
  s.ring_dtp = all;
  s.vocab.chunk = 7;
  s.checkpoint.schedule = all ? CheckpointSchedule::sco : CheckpointSchedule::resident;
  // The attention's queries and the ring's K/V in pieces (every shard of 24 or 29 tokens cut).
  s.attention_piece = all ? 3 : 0;
  return s;
}

struct CpRun {
  std::unique_ptr<CpuDevice> dev;
  HostMemory host;
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
};

// prefetch_depth: SCO's ring (CheckpointOptions::prefetch_depth; 0 a one-slot ring).
std::unique_ptr<CpRun> make_run(int cp, bool all, bool keep_attention = false, std::int64_t prefetch_depth = 1,
                                std::int64_t attention_piece = kRingPieceTokens) {
  Communicator& world = testing::world();
  ParallelLayout layout;
  layout.cp = cp;
  layout.ep = world.size();
  while (8 % layout.ep != 0 || world.size() % layout.ep != 0) --layout.ep;
  layout.vocab = world.size();
  auto r = std::make_unique<CpRun>();
  r->dev = std::make_unique<CpuDevice>(128 << 20);
  r->groups = ProcessGroups::split(world, layout);
  ModelSchedules sched = schedules(all);
  sched.keep_attention = keep_attention;
  sched.checkpoint.prefetch_depth = prefetch_depth;
  sched.attention_piece = attention_piece;
  r->model = std::make_unique<MoeTransformer>(*r->dev, r->host, r->groups, cp_config(), sched);
  r->model->init_parameters(7);
  return r;
}

// The step's global batch: W x per_rank sequences of S tokens, sequence g of step `step`
// the same under every layout. With cp, data-parallel rank d = rank / cp of W / cp holds
// per_rank x cp of them (every rank of its group the same); with cp 1 rank r holds per_rank.
void batch(std::int64_t step, int cp, std::int64_t per_rank, std::int64_t S, std::vector<std::int32_t>& ids,
           std::vector<std::int32_t>& tgt) {
  const KvRetrievalTask task = KvRetrievalTask::standard(300, S, 11);
  const int W = testing::world().size(), d = testing::world().rank() / cp;
  const std::int64_t n = per_rank * cp;  // this rank's sequences
  ids.clear();
  tgt.clear();
  for (std::int64_t b = 0; b < n; ++b) {
    const KvRetrievalTask::Sequence s = task.sequence(step * W * per_rank + d * n + b);
    ids.insert(ids.end(), s.inputs.begin(), s.inputs.end());
    // Every token scored (the next token), but a few, so the loss sees most rows.
    for (std::size_t t = 0; t < s.inputs.size(); ++t)
      tgt.push_back(t % 13 == 4 ? -100 : t + 1 < s.inputs.size() ? s.inputs[t + 1] : s.targets[t]);
  }
}

struct StepResult {
  double loss = 0;
  std::unique_ptr<CpRun> run;
};

// One forward_backward over the step's batch; store gradients summed over their groups.
StepResult one_step(int cp, bool all, std::int64_t S, bool keep_attention = false, std::int64_t prefetch_depth = 1,
                    std::int64_t attention_piece = kRingPieceTokens) {
  Communicator& world = testing::world();
  StepResult out;
  out.run = make_run(cp, all, keep_attention, prefetch_depth, attention_piece);
  MoeTransformer& m = *out.run->model;
  std::vector<std::int32_t> ids, tgt;
  batch(0, cp, 1, S, ids, tgt);
  const std::int64_t n = static_cast<std::int64_t>(ids.size()) / S;
  std::int64_t valid = 0;
  for (std::int32_t t : tgt) valid += t != -100;
  world.all_reduce(&valid, 1, DType::i64, ReduceOp::sum);
  valid /= cp;  // every rank of a cp group counted the group's sequences
  m.zero_grads();
  const BatchSums s = m.forward_backward(ids.data(), tgt.data(), n, S, 1.0f / float(valid), 1.0f);
  double ce = s.ce;
  world.all_reduce(&ce, 1, DType::f64, ReduceOp::sum);
  out.loss = ce / double(valid) + s.aux;
  std::vector<ParameterStore*> st = m.stores();
  std::vector<Communicator*> g = m.store_groups();
  for (std::size_t i = 0; i < st.size(); ++i)
    g[i]->all_reduce(st[i]->grads_data(), st[i]->elements(), DType::f32, ReduceOp::sum);
  return out;
}

// Worst relative error over every gradient (FSDP units and both stores; the layouts
// differ only in cp, so the shards line up element by element).
double worst_gradient_error(CpRun& a, CpRun& b) {
  Communicator& world = testing::world();
  double worst = 0;
  FsdpUnits& fa = a.model->fsdp();
  FsdpUnits& fb = b.model->fsdp();
  for (std::size_t u = 0; u < fa.size(); ++u) {
    const double e = verify::group_relative_error(world, fb.grads_shard() + fb.shard_offset(u),
                                                  fa.grads_shard() + fa.shard_offset(u),
                                                  static_cast<std::int64_t>(fa.shard_len(u)));
    EXPECT_LT(e, 1e-5) << "fsdp unit " << u;
    worst = std::max(worst, e);
  }
  for (std::size_t i = 0; i < a.model->stores().size(); ++i) {
    ParameterStore& sa = *a.model->stores()[i];
    ParameterStore& sb = *b.model->stores()[i];
    for (std::size_t v = 0; v < sa.size(); ++v) {
      const ParameterView& va = sa.views()[v];
      const double e = verify::group_relative_error(world, sb.grad(sb.views()[v]), sa.grad(va), va.numel());
      EXPECT_LT(e, 1e-5) << va.name();
      worst = std::max(worst, e);
    }
  }
  return worst;
}

// The loss and every gradient of b bitwise a's (the same layout: the shards line up).
void expect_same_bits(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(a.loss, b.loss);
  const FsdpUnits& fa = a.run->model->fsdp();
  const FsdpUnits& fb = b.run->model->fsdp();
  ASSERT_EQ(fa.shard_elements(), fb.shard_elements());
  for (std::uint64_t i = 0; i < fa.shard_elements(); ++i)
    ASSERT_EQ(float_bits(fa.grads_shard()[i]), float_bits(fb.grads_shard()[i])) << i;
  for (std::size_t k = 0; k < a.run->model->stores().size(); ++k) {
    const ParameterStore& sa = *a.run->model->stores()[k];
    const ParameterStore& sb = *b.run->model->stores()[k];
    for (std::uint64_t i = 0; i < sa.elements(); ++i)
      ASSERT_EQ(float_bits(sa.grads_data()[i]), float_bits(sb.grads_data()[i])) << "store " << k << " " << i;
  }
}

std::vector<int> cp_sizes() {
  std::vector<int> out;
  const int W = testing::world().size();
  for (int cp = 2; cp <= W; ++cp)
    if (W % cp == 0) out.push_back(cp);
  return out;
}

TEST(ContextParallel, OneStepLossAndEveryGradientMatchCp1) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  for (const bool all : {false, true})
    for (const std::int64_t S : {std::int64_t{24}, std::int64_t{29}}) {
      StepResult base = one_step(1, all, S);
      for (const int cp : cp_sizes()) {
        SCOPED_TRACE("cp " + std::to_string(cp) + ", S " + std::to_string(S) + (all ? ", all" : ", none"));
        StepResult r = one_step(cp, all, S);
        EXPECT_LT(std::abs(r.loss - base.loss) / std::abs(base.loss), 1e-5) << base.loss << " vs " << r.loss;
        const double worst = worst_gradient_error(*base.run, *r.run);
        if (world.rank() == 0)
          std::printf("cp %d vs 1 at %d ranks, S %lld, schedules %s: loss %.8f vs %.8f, worst gradient rel err %.3g\n",
                      cp, world.size(), static_cast<long long>(S), all ? "all" : "none", base.loss, r.loss, worst);
      }
    }
}

// --keep-attention under context parallelism: the backward takes each layer's kept o and
// lse instead of running the ring again (on every rank of the group alike), and nothing
// changes: the loss and every gradient bitwise, at each cp dividing the world.
TEST(ContextParallel, KeepAttentionChangesNoBit) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  for (const int cp : cp_sizes()) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    expect_same_bits(one_step(cp, true, 29), one_step(cp, true, 29, true));
  }
}

// SCO's one-slot ring (prefetch_depth 0: every decoder layer's forward in place in the
// slot, each boundary fetched back when the slot is free) against the default two slots:
// the loss and every gradient bitwise, at cp 1 and each cp dividing the world, with the
// attention kept too (its kept o belongs to the slot's boundary of each layer in turn).
// Each run's checkpoint peak is one boundary below the two-slot run's. With the queries in
// pieces (pieces of 5 tokens) and without the attention kept, the one-slot ring also puts
// every layer's attention output on the host (offloads_attention_output): the same bits,
// and an attention peak no higher than the two-slot run's.
TEST(ContextParallel, OneSlotRingChangesNoBit) {
  std::vector<int> cps = cp_sizes();
  cps.insert(cps.begin(), 1);
  for (const int cp : cps)
    for (const bool keep : {false, true})
      for (const std::int64_t piece : {kRingPieceTokens, std::int64_t{5}}) {
        SCOPED_TRACE("cp " + std::to_string(cp) + (keep ? ", attention kept" : "") + ", pieces of " +
                     std::to_string(piece));
        StepResult two = one_step(cp, true, 29, keep, 1, piece), one = one_step(cp, true, 29, keep, 0, piece);
        expect_same_bits(two, one);
        // The host area for o exists exactly when the one-slot ring offloads it.
        EXPECT_EQ(one.run->host.peak(Component::attention) > 0, piece == 5 && !keep);
        EXPECT_EQ(two.run->host.peak(Component::attention), 0u);
        EXPECT_LE(one.run->dev->arena().peak(Component::attention), two.run->dev->arena().peak(Component::attention));
        const std::uint64_t a = two.run->dev->arena().peak(Component::checkpoints);
        const std::uint64_t b = one.run->dev->arena().peak(Component::checkpoints);
        EXPECT_EQ(b, a / 2) << "two slots " << a << ", one " << b;
        EXPECT_GT(b, 0u);
      }
  // Past one tile of the final norm's backward, which the one-slot ring's parked final
  // hidden (parks_final_hidden) runs a tile at a time over d_hn: two tiles and a part.
  SCOPED_TRACE("cp 1, the final norm's backward in 3 tiles");
  const std::int64_t S = 2 * kFinalNormTileRows + 77;
  expect_same_bits(one_step(1, true, S, false, 1), one_step(1, true, S, false, 0));
}

TEST(ContextParallel, FiveStepsSameLossCurve) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  const std::int64_t S = 27;
  std::vector<int> layouts = {1};
  for (const int cp : cp_sizes()) layouts.push_back(cp);
  std::vector<std::vector<double>> curves;
  for (const int cp : layouts) {
    std::unique_ptr<CpRun> run = make_run(cp, true);
    ThreadPool pool(1);
    TrainerOptions o;
    o.optimizer = "offload_stream";
    o.optimizer_options.adam.lr = 3e-3f;
    o.lr = LrSchedule{3e-3f, 3e-4f, 1, 5};
    Trainer trainer(*run->model, run->host, pool, o);
    std::vector<double> curve;
    std::vector<std::int32_t> ids, tgt;
    for (std::int64_t step = 0; step < 5; ++step) {
      batch(0, cp, 1, S, ids, tgt);  // the same batch: the loss must fall
      const MicroBatch mb{ids.data(), tgt.data(), static_cast<std::int64_t>(ids.size()) / S, S};
      const StepStats st = trainer.step({&mb, 1});
      EXPECT_EQ(st.inputs, world.size() * S);  // every token of the global batch once
      curve.push_back(st.loss);
    }
    curves.push_back(curve);
  }
  for (std::size_t k = 1; k < curves.size(); ++k)
    for (int i = 0; i < 5; ++i)
      EXPECT_LT(std::abs(curves[k][i] - curves[0][i]) / std::abs(curves[0][i]), 1e-5)
          << "cp " << layouts[k] << " step " << i + 1 << ": " << curves[0][i] << " vs " << curves[k][i];
  EXPECT_LT(curves[0][4], curves[0][0]);  // it trains
}

// The ranks of a cp group must bring the same sequences; differing ones are refused on
// every rank (no hang), and a sequence shorter than 2 cp tokens is refused.
TEST(ContextParallel, RefusesDifferentSequencesAndShortOnes) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "context parallelism needs 2 or more ranks";
  const int cp = world.size();
  std::unique_ptr<CpRun> run = make_run(cp, false);
  std::vector<std::int32_t> ids, tgt;
  batch(0, cp, 1, 24, ids, tgt);
  if (world.rank() == cp - 1) ids[5] = (ids[5] + 1) % 300;
  const std::int64_t n = static_cast<std::int64_t>(ids.size()) / 24;
  EXPECT_THROW(run->model->forward(ids.data(), tgt.data(), n, 24), InvalidArgument);
  EXPECT_THROW(run->model->forward(ids.data(), tgt.data(), 1, 2 * cp - 1), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
