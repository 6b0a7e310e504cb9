// The four schedules change where memory lives, never the math: one training step with
// every schedule on (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW) against every
// schedule off (standard EP, materialized logits, resident boundaries, AdamW state on
// the device; the MLP sublayers whole, not in row tiles) on the same model, data and layout gives the same loss and every
// gradient to 1e-5 relative, and 20 steps the same loss curve to 1e-4. Runs at 1-4
// ranks (ep = the largest divisor of the ranks and the 8 experts, vocab group = all).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/trainer.h"
#include "peakbound/verify/relative_error.h"
#include "tests/comm/world.h"
#include "tests/train/model_step.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

ModelConfig small_config() { return testing::small_train_config("exact-test"); }

struct ModelRun {
  std::unique_ptr<CpuDevice> dev;
  HostMemory host;
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
};

ModelSchedules schedules(bool all) {
  ModelSchedules s;
  s.dispatch = all ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
  s.dispatch_options.cap = 5;  // several pipelined rounds on these few tokens
  s.ring_dtp = all;
  s.vocab.chunk = 7;
  s.checkpoint.schedule = all ? CheckpointSchedule::sco : CheckpointSchedule::resident;
  s.moe_tile = all ? 5 : 0;  // the MLP sublayers over row tiles that cut the 24-token sequences
  // The attention's queries (and under cp the ring's K/V) in pieces that cut them too.
  s.attention_piece = all ? 5 : 0;
  return s;
}

std::unique_ptr<ModelRun> make_run(bool all) {
  Communicator& world = testing::world();
  const int W = world.size();
  ParallelLayout layout;
  layout.ep = W;
  while (8 % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
  layout.vocab = W;
  auto r = std::make_unique<ModelRun>();
  r->dev = std::make_unique<CpuDevice>(128 << 20);
  r->groups = ProcessGroups::split(world, layout);
  r->model = std::make_unique<MoeTransformer>(*r->dev, r->host, r->groups, small_config(), schedules(all));
  r->model->init_parameters(7);
  return r;
}

// This rank's sequences of step `step` (2 per rank, 24 tokens).
void batch(std::int64_t step, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& tgt) {
  const KvRetrievalTask task = KvRetrievalTask::standard(300, 24, 11);
  const int W = testing::world().size(), r = testing::world().rank();
  ids.clear();
  tgt.clear();
  for (int b = 0; b < 2; ++b) {
    // Every token scored (the next token), so the vocabulary loss sees all rows.
    const KvRetrievalTask::Sequence s = task.sequence((step * W + r) * 2 + b);
    ids.insert(ids.end(), s.inputs.begin(), s.inputs.end());
    for (std::size_t t = 0; t < s.inputs.size(); ++t)
      tgt.push_back(t + 1 < s.inputs.size() ? s.inputs[t + 1] : s.targets[t]);
  }
}

// Every gradient of `b` against `a`, to 1e-5 relative over each whole tensor: the FSDP
// units' shards (already summed over the world) and every tensor of the stores (whose
// gradients must be summed over their groups first). Returns the worst error.
double expect_same_gradients(MoeTransformer& a_model, MoeTransformer& b_model) {
  Communicator& world = testing::world();
  double worst = 0;
  // The FSDP units: every rank holds its shard of each unit (gradients already summed).
  for (std::size_t u = 0; u < a_model.fsdp().size(); ++u) {
    FsdpUnits& a = a_model.fsdp();
    FsdpUnits& b = b_model.fsdp();
    const double e = verify::group_relative_error(world, b.grads_shard() + b.shard_offset(u),
                                                  a.grads_shard() + a.shard_offset(u),
                                                  static_cast<std::int64_t>(a.shard_len(u)));
    EXPECT_LT(e, 1e-5) << "fsdp unit " << u;
    worst = std::max(worst, e);
  }
  for (std::size_t i = 0; i < a_model.stores().size(); ++i) {
    ParameterStore& a = *a_model.stores()[i];
    ParameterStore& b = *b_model.stores()[i];
    EXPECT_EQ(a.size(), b.size());
    if (a.size() != b.size()) return 1.0;
    for (std::size_t v = 0; v < a.size(); ++v) {
      const ParameterView& va = a.views()[v];
      // Every rank holds its part of the tensor: the error is over the whole tensor.
      const double e = verify::group_relative_error(world, b.grad(b.views()[v]), a.grad(va), va.numel());
      EXPECT_LT(e, 1e-5) << va.name();
      worst = std::max(worst, e);
    }
  }
  return worst;
}

double one_step(ModelRun& run, const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& tgt) {
  return testing::world_step(*run.model, ids, tgt, 2, 24);
}

TEST(SchedulesExact, OneStepLossAndEveryGradient) {
  Communicator& world = testing::world();
  std::vector<std::int32_t> ids, tgt;
  batch(0, ids, tgt);
  std::unique_ptr<ModelRun> runs[2] = {make_run(false), make_run(true)};
  double loss[2];
  for (int k = 0; k < 2; ++k) loss[k] = one_step(*runs[k], ids, tgt);
  EXPECT_LT(std::abs(loss[1] - loss[0]) / std::abs(loss[0]), 1e-5) << loss[0] << " vs " << loss[1];
  // An evaluation forward leaves nothing of the vocabulary loss held (no backward follows).
  for (int k = 0; k < 2; ++k) {
    runs[k]->model->forward(ids.data(), tgt.data(), 2, 24);
    EXPECT_EQ(runs[k]->dev->arena().live(Component::vocab), 0u) << (k ? "all" : "none");
  }
  const double worst = expect_same_gradients(*runs[0]->model, *runs[1]->model);
  if (world.rank() == 0)
    std::printf("all vs none, one step at %d ranks: loss %.8f vs %.8f, worst gradient rel err %.3g\n", world.size(),
                loss[0], loss[1], worst);
}

// Tokens without a target (ignore_index) never enter Ring-DTP: the model moves the
// scored rows of the normed hidden together, runs the loss over them and puts their
// gradient rows back, zeros in the others. Against every schedule off (materialized
// logits over every row): the same loss and every gradient, for masks that leave a
// prompt unscored, score isolated tokens between unscored ones, leave a gap inside a
// sequence, score nothing on a rank, or score everything. The loss's memory does not
// depend on the mask: Ring-DTP's buffers are sized for the step's tokens, so its
// measured vocabulary peak equals the all-scored step's.
TEST(SchedulesExact, TokensWithoutATargetLeaveTheLossAndGradientsExact) {
  Communicator& world = testing::world();
  const int W = world.size(), r = world.rank();
  std::vector<std::int32_t> ids, all_scored;
  batch(0, ids, all_scored);
  std::uint64_t scored_peak = 0;
  {
    std::unique_ptr<ModelRun> run = make_run(true);
    (void)one_step(*run, ids, all_scored);
    scored_peak = run->dev->arena().peak(Component::vocab);
  }
  const auto ignored = [](int pattern, std::int64_t t) {
    const std::int64_t b = t / 24, i = t % 24;
    switch (pattern) {
      case 0: return i < 11;                            // a prompt unscored
      case 1: return i % 3 != 1 || (b == 1 && i >= 19);  // isolated tokens, a suffix off
      case 2: return true;                              // nothing scored on this rank
      case 3: return i == 0 || (b == 1 && i >= 6 && i < 20);  // a gap inside a sequence
      default: return false;                            // everything scored
    }
  };
  for (int variant = 0; variant < 5; ++variant) {
    const int pattern = (r + variant) % 5;
    std::vector<std::int32_t> tgt = all_scored;
    for (std::int64_t t = 0; t < std::int64_t(tgt.size()); ++t)
      if (ignored(pattern, t)) tgt[std::size_t(t)] = -100;
    std::int64_t valid = std::count_if(tgt.begin(), tgt.end(), [](std::int32_t t) { return t != -100; });
    world.all_reduce(&valid, 1, DType::i64, ReduceOp::sum);
    if (valid == 0) continue;  // one rank, nothing scored: no loss to compare
    SCOPED_TRACE("variant " + std::to_string(variant) + " at " + std::to_string(W) + " ranks");
    std::unique_ptr<ModelRun> runs[2] = {make_run(false), make_run(true)};
    double loss[2];
    for (int k = 0; k < 2; ++k) loss[k] = one_step(*runs[k], ids, tgt);
    EXPECT_LT(std::abs(loss[1] - loss[0]) / std::abs(loss[0]), 1e-5) << loss[0] << " vs " << loss[1];
    const double worst = expect_same_gradients(*runs[0]->model, *runs[1]->model);
    EXPECT_EQ(runs[1]->dev->arena().peak(Component::vocab), scored_peak);
    if (r == 0)
      std::printf("scored rows only, variant %d at %d ranks: loss %.8f vs %.8f, worst gradient rel err %.3g\n",
                  variant, W, loss[0], loss[1], worst);
  }
}

TEST(SchedulesExact, TwentyStepsSameLossCurve) {
  Communicator& world = testing::world();
  std::vector<double> curve[2];
  for (int k = 0; k < 2; ++k) {
    std::unique_ptr<ModelRun> run = make_run(k == 1);
    ThreadPool pool(1);
    TrainerOptions o;
    o.optimizer = k == 1 ? "offload_stream" : "device";
    o.optimizer_options.adam.lr = 3e-3f;
    o.optimizer_options.bucket_bytes = 4096;
    o.lr = LrSchedule{3e-3f, 3e-4f, 3, 20};
    Trainer trainer(*run->model, run->host, pool, o);
    std::vector<std::int32_t> ids, tgt;
    for (std::int64_t step = 0; step < 20; ++step) {
      batch(step, ids, tgt);
      const MicroBatch mb{ids.data(), tgt.data(), 2, 24};
      curve[k].push_back(trainer.step({&mb, 1}).loss);
    }
  }
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const double e = std::abs(curve[1][i] - curve[0][i]) / std::abs(curve[0][i]);
    EXPECT_LT(e, 1e-4) << "step " << i + 1;
    worst = std::max(worst, e);
  }
  EXPECT_LT(curve[0][19], curve[0][0]);  // it trains
  if (world.rank() == 0)
    std::printf("all vs none, 20 steps at %d ranks: loss %.6f -> %.6f, worst step rel diff %.3g\n", world.size(),
                curve[0][0], curve[0][19], worst);
}

// Gradient accumulation: two micro-batches of one sequence per rank make the same step
// as one micro-batch of two (the cross-entropy is normalised over the whole step). The
// aux loss is per micro-batch (as transformers computes it per forward), so it is off here.
// What is compared is what accumulation produces: the loss and the step's gradients as
// the trainer accumulated them (the trainer leaves them in the model after the step).
// Not the parameters after AdamW: a first Adam step moves each element by about
// lr * g / (|g| + eps), a sign function of g, so an element whose gradient is at the
// rounding level of the GEMMs (which differ in the last bits between the AVX2 and the
// AVX-512 OpenBLAS kernels, and between M = 24 and M = 48) moves by +lr on one side and
// -lr on the other; that measured the BLAS kernel (3.1e-5 relative on Zen 4), not the
// accumulation.
TEST(SchedulesExact, AccumulationEqualsOneLargerMicroBatch) {
  std::vector<std::int32_t> ids, tgt;
  batch(0, ids, tgt);
  std::vector<double> loss;
  std::unique_ptr<ModelRun> runs[2];
  for (int accumulate = 0; accumulate < 2; ++accumulate) {
    Communicator& w = testing::world();
    ParallelLayout layout;
    layout.ep = w.size();
    while (8 % layout.ep != 0 || w.size() % layout.ep != 0) --layout.ep;
    layout.vocab = w.size();
    auto& r = runs[accumulate];
    r = std::make_unique<ModelRun>();
    r->dev = std::make_unique<CpuDevice>(128 << 20);
    r->groups = ProcessGroups::split(w, layout);
    ModelConfig c = small_config();
    c.router_aux_loss_coef = 0;
    r->model = std::make_unique<MoeTransformer>(*r->dev, r->host, r->groups, c, schedules(false));
    r->model->init_parameters(3);
    ThreadPool pool(1);
    TrainerOptions o;
    o.optimizer_options.adam.lr = 1e-2f;
    Trainer trainer(*r->model, r->host, pool, o);
    std::vector<MicroBatch> mb;
    if (accumulate) {
      mb.push_back({ids.data(), tgt.data(), 1, 24});
      mb.push_back({ids.data() + 24, tgt.data() + 24, 1, 24});
    } else {
      mb.push_back({ids.data(), tgt.data(), 2, 24});
    }
    loss.push_back(trainer.step(mb).loss);
    // The stores hold each rank's own sums (the trainer reduce-scatters from them into
    // its shard): summed over each group here, as the trainer's shard holds them.
    std::vector<ParameterStore*> st = r->model->stores();
    std::vector<Communicator*> g = r->model->store_groups();
    for (std::size_t i = 0; i < st.size(); ++i)
      g[i]->all_reduce(st[i]->grads_data(), st[i]->elements(), DType::f32, ReduceOp::sum);
  }
  EXPECT_LT(std::abs(loss[1] - loss[0]) / loss[0], 1e-6) << loss[0] << " vs " << loss[1];
  const double worst = expect_same_gradients(*runs[0]->model, *runs[1]->model);
  if (testing::world().rank() == 0)
    std::printf("2 micro-batches vs 1 of twice the size at %d ranks: worst gradient rel err %.3g\n",
                testing::world().size(), worst);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
