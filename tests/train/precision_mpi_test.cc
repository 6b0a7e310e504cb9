// The model and the trainer under bf16 (ModelSchedules::precision, docs/precision.md), at
// 1-4 ranks (ep = the largest divisor of the ranks and the 8 experts, vocab group = all):
//   - one step's loss and every parameter's gradient, the bf16 model against the f32 model
//     from the same init, the f32 one holding the widened bf16 values of the same
//     parameters (so only the bf16 activations differ): loss within 1e-2 relative, every
//     gradient's cosine >= 0.999. Why: each stored activation rounds by up to 2^-9
//     relative, a layer chains about 5 such roundings and the model 3 layers, the norm and
//     the head; the gradients are fp32 sums of bf16 products, so they keep their direction;
//   - 10 training steps on the copy task in bf16: finite, the loss falls; the optimizer
//     state read at step 5 (what a checkpoint holds: the fp32 master, m, v) restored into
//     a fresh bf16 model and trainer gives the straight run's losses bitwise (restore
//     narrows the master with AdamW's rounding, so the compute copy is the same bits);
//   - every schedule on (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW) against every
//     schedule off, both bf16, every expert selected: loss within 1e-3 relative, each
//     gradient norm-wise within 5e-2 and cosine >= 0.999. Why not bitwise: a schedule
//     changes the fp32 summation order (the dispatch's combine, the vocabulary loss's
//     blocks), about 1e-6 relative, which now and then flips one bf16 rounding of an
//     activation by an ulp (2^-8 relative), and flips propagate at ulp scale. Why every
//     expert: a router near-tie would switch an expert on some machines (see there).
//     SCO against resident boundaries moves memory only: bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/train/copy_task.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"
#include "tests/train/model_step.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct ModelRun {
  std::unique_ptr<CpuDevice> dev;
  HostMemory host;
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
};

ModelSchedules schedules(bool all, Precision p) {
  ModelSchedules s;
  s.dispatch = all ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
  s.dispatch_options.cap = 5;  // several pipelined rounds on these few tokens
  s.ring_dtp = all;
  s.vocab.chunk = 7;
  s.checkpoint.schedule = all ? CheckpointSchedule::sco : CheckpointSchedule::resident;
  s.precision = p;
  return s;
}

// top_k: experts per token (0: the shared config's 2 of 8).
std::unique_ptr<ModelRun> make_run(const ModelSchedules& s, std::uint64_t seed, std::int64_t top_k = 0) {
  Communicator& world = testing::world();
  const int W = world.size();
  ParallelLayout layout;
  layout.ep = W;
  while (8 % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
  layout.vocab = W;
  auto r = std::make_unique<ModelRun>();
  r->dev = std::make_unique<CpuDevice>(128 << 20);
  r->groups = ProcessGroups::split(world, layout);
  ModelConfig c = testing::small_train_config("bf16-test");
  if (top_k > 0) c.top_k = top_k;
  r->model = std::make_unique<MoeTransformer>(*r->dev, r->host, r->groups, c, s);
  r->model->init_parameters(seed);
  return r;
}

// An f32 model's parameters x -> to_f32(to_bf16(x)): what the bf16 model computes with.
void round_to_bf16(MoeTransformer& m) {
  Device& dev = m.experts().device();
  auto round = [&dev](float* p, std::uint64_t n) {
    std::vector<float> h(n);
    copy_to_host(dev, h.data(), p, n * sizeof(float));
    for (float& x : h) x = to_f32(to_bf16(x));
    copy_to_device(dev, p, h.data(), n * sizeof(float));
  };
  round(m.fsdp().params_shard(), m.fsdp().shard_elements());
  for (ParameterStore* s : m.stores()) round(s->params_data(), s->elements());
}

// One copy-task batch of this rank: 2 sequences of 24 tokens.
void batch(std::int64_t step, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& tgt) {
  const CopyTask task{300, 24, 0, 11};
  const int W = testing::world().size(), r = testing::world().rank();
  ids.clear();
  tgt.clear();
  for (int b = 0; b < 2; ++b) {
    const CopyTask::Sequence s = task.sequence((step * W + r) * 2 + b);
    ids.insert(ids.end(), s.inputs.begin(), s.inputs.end());
    tgt.insert(tgt.end(), s.targets.begin(), s.targets.end());
  }
}

// One forward_backward of batch 0 (testing::world_step): the world's mean loss, the
// stores' gradients summed over their groups.
double one_step(MoeTransformer& m) {
  std::vector<std::int32_t> ids, tgt;
  batch(0, ids, tgt);
  return testing::world_step(m, ids, tgt, 2, 24);
}

// This rank's piece of tensor e's gradient in model m: [ptr, ptr + n), or n = 0.
std::pair<const float*, std::uint64_t> grad_piece(MoeTransformer& m, const TensorEntry& e) {
  if (e.kind == TensorKind::expert || e.kind == TensorKind::head) {
    ParameterStore& s = e.kind == TensorKind::expert ? m.experts() : m.head();
    if (!s.contains(e.name)) return {nullptr, 0};
    return {s.grad(e.name), static_cast<std::uint64_t>(s.view(e.name).numel())};
  }
  FsdpUnits& f = m.fsdp();
  const auto [u, v] = f.find(e.name);
  const std::uint64_t len = f.shard_len(u), lo = static_cast<std::uint64_t>(f.group().rank()) * len;
  const std::uint64_t b = std::max(lo, v->offset), end = std::min(lo + len, v->offset + std::uint64_t(v->numel()));
  if (b >= end) return {nullptr, 0};
  return {f.grads_shard() + f.shard_offset(u) + (b - lo), end - b};
}

struct GradDiff {
  std::string worst_cos_name, worst_rel_name;
  double worst_cos = 1, worst_rel = 0;
  int below = 0;  // tensors under the cosine bound
};

// Every tensor's gradient of `got` against `ref` over the world: cosine and
// max|got - ref| / max|ref|. A store tensor's piece is held by each replica alike (summed
// over the group), so every tensor's sums scale uniformly and the cosine is exact.
// check: EXPECT the bounds (else only measure).
GradDiff compare_gradients(MoeTransformer& got, MoeTransformer& ref, double min_cos, double max_rel,
                           bool check = true) {
  Communicator& world = testing::world();
  const std::vector<TensorEntry> entries = ref.table().entries();
  const std::size_t n = entries.size();
  std::vector<double> sums(3 * n, 0.0), maxes(2 * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto [pg, cnt] = grad_piece(got, entries[i]);
    const auto [pr, cnt_ref] = grad_piece(ref, entries[i]);
    EXPECT_EQ(cnt, cnt_ref) << entries[i].name;
    if (cnt == 0 || cnt != cnt_ref) continue;
    std::vector<float> a(cnt), b(cnt);
    copy_to_host(got.experts().device(), a.data(), pg, cnt * sizeof(float));
    copy_to_host(ref.experts().device(), b.data(), pr, cnt * sizeof(float));
    for (std::uint64_t k = 0; k < cnt; ++k) {
      sums[3 * i] += double(a[k]) * b[k];
      sums[3 * i + 1] += double(a[k]) * a[k];
      sums[3 * i + 2] += double(b[k]) * b[k];
      maxes[2 * i] = std::max(maxes[2 * i], std::abs(double(a[k]) - b[k]));
      maxes[2 * i + 1] = std::max(maxes[2 * i + 1], std::abs(double(b[k])));
    }
  }
  world.all_reduce(sums.data(), sums.size(), DType::f64, ReduceOp::sum);
  world.all_reduce(maxes.data(), maxes.size(), DType::f64, ReduceOp::max);
  GradDiff d;
  for (std::size_t i = 0; i < n; ++i) {
    const double na = std::sqrt(sums[3 * i + 1]), nb = std::sqrt(sums[3 * i + 2]);
    const double cos = na == 0 && nb == 0 ? 1.0 : (na == 0 || nb == 0 ? 0.0 : sums[3 * i] / (na * nb));
    const double rel = maxes[2 * i + 1] > 0 ? maxes[2 * i] / maxes[2 * i + 1] : maxes[2 * i];
    if (cos < min_cos) ++d.below;
    if (cos < d.worst_cos) d.worst_cos = cos, d.worst_cos_name = entries[i].name;
    if (rel > d.worst_rel) d.worst_rel = rel, d.worst_rel_name = entries[i].name;
  }
  if (!check) return d;
  EXPECT_GE(d.worst_cos, min_cos) << "worst gradient cosine: " << d.worst_cos_name;
  EXPECT_LE(d.worst_rel, max_rel) << "worst gradient max|got - ref| / max|ref|: " << d.worst_rel_name;
  return d;
}

// Every expert selected (top_k = E = 8): the router's selection has no discontinuity, so
// the comparison measures the bf16 roundings alone. With top-2 of 8 (the shared config),
// router logits whose 2nd and 3rd experts lie within the bf16 noise switch a token's
// expert: measured at 1 rank, seed 7, one token of layer 2 went to expert 3 under f32
// and not under bf16 (cosine 0 there), which moves every upstream gradient to a cosine of
// about 0.995. That model's loss is held to 1e-2, its gradients reported, not bounded.
TEST(Precision, Bf16StepAgainstF32OnTheSameParameters) {
  const int rank = testing::world().rank(), W = testing::world().size();
  for (std::int64_t top_k : {8, 2}) {
    std::unique_ptr<ModelRun> f32 = make_run(schedules(false, Precision::f32), 7, top_k);
    round_to_bf16(*f32->model);
    std::unique_ptr<ModelRun> bf = make_run(schedules(false, Precision::bf16), 7, top_k);
    const double l32 = one_step(*f32->model), l16 = one_step(*bf->model);
    const double rel = std::abs(l16 - l32) / std::abs(l32);
    EXPECT_LE(rel, 1e-2) << "top " << top_k << ": " << l16 << " vs " << l32;
    // No norm-wise bound asked for here (cosine only): 1.0 lets the relative error be reported.
    const GradDiff d = compare_gradients(*bf->model, *f32->model, 0.999, 1.0, top_k == 8);
    if (rank == 0)
      std::printf("bf16 vs f32, top %lld of 8, at %d ranks: loss %.6f vs %.6f (rel %.2e), worst gradient cosine "
                  "%.6f (%s), %d tensors under 0.999, worst max-rel %.3g (%s)\n",
                  static_cast<long long>(top_k), W, l16, l32, rel, d.worst_cos, d.worst_cos_name.c_str(), d.below,
                  d.worst_rel, d.worst_rel_name.c_str());
  }
}

TEST(Precision, Bf16SchedulesAllAgainstNone) {
  // Every expert selected (top 8 of 8), as in the test above: with top 2 of 8 a router
  // near-tie switches a token's expert on some seeds and rank counts (seeds 1-7 tried: 4, 5
  // and 7 switch one, cosine down to 0 for that expert), and whether it switches depends on
  // the machine's GEMM bits (native or convert path, OpenBLAS's kernels), so a top-2 bound
  // would hold on one CPU kind and fail on another. Without switches, what a schedule
  // changes is the fp32 summation order, which now and then flips a bf16 rounding by an ulp
  // (2^-8 relative). Measured over seeds 1-6 at 1-4 ranks: loss within 1.8e-4 relative,
  // worst gradient cosine 0.99982, worst norm-wise error (max|a-b| / max|b| per tensor)
  // 3.3e-2, on the small q_norm / k_norm vectors (8 elements) where one flip weighs most.
  // Bounds: loss 1e-3, cosine 0.999, norm-wise 5e-2 (1.5x the worst measured).
  const std::uint64_t seed = 3;
  const std::int64_t every_expert = 8;
  std::unique_ptr<ModelRun> none = make_run(schedules(false, Precision::bf16), seed, every_expert);
  std::unique_ptr<ModelRun> all = make_run(schedules(true, Precision::bf16), seed, every_expert);
  const double l0 = one_step(*none->model), l1 = one_step(*all->model);
  const double rel = std::abs(l1 - l0) / std::abs(l0);
  EXPECT_LE(rel, 1e-3) << l1 << " vs " << l0;
  const GradDiff d = compare_gradients(*all->model, *none->model, 0.999, 5e-2);
  // The evaluation forward (no stack, nothing kept) in bf16: the same loss as the training
  // forward of the same batch, and nothing of the vocabulary loss left held.
  for (ModelRun* r : {none.get(), all.get()}) {
    std::vector<std::int32_t> ids, tgt;
    batch(0, ids, tgt);
    std::int64_t valid = std::count_if(tgt.begin(), tgt.end(), [](std::int32_t t) { return t != -100; });
    const BatchSums e = r->model->forward(ids.data(), tgt.data(), 2, 24);
    double ce = e.ce;
    testing::world().all_reduce(&valid, 1, DType::i64, ReduceOp::sum);
    testing::world().all_reduce(&ce, 1, DType::f64, ReduceOp::sum);
    EXPECT_LE(std::abs(ce / double(valid) + e.aux - (r == all.get() ? l1 : l0)), 1e-6 * l0);
    EXPECT_EQ(r->dev->arena().live(Component::vocab), 0u);
  }
  // SCO against resident boundaries, every other schedule off: the same math, bitwise.
  ModelSchedules sco = schedules(false, Precision::bf16);
  sco.checkpoint.schedule = CheckpointSchedule::sco;
  std::unique_ptr<ModelRun> offloaded = make_run(sco, seed, every_expert);
  EXPECT_EQ(one_step(*offloaded->model), l0);
  const GradDiff same = compare_gradients(*offloaded->model, *none->model, 0.999, 0.0);
  if (testing::world().rank() == 0)
    std::printf("bf16 all vs none at %d ranks: loss %.8f vs %.8f (rel %.2e), worst gradient max-rel %.3g (%s), "
                "worst cosine %.7f (%s); sco vs resident worst %.3g\n",
                testing::world().size(), l1, l0, rel, d.worst_rel, d.worst_rel_name.c_str(), d.worst_cos,
                d.worst_cos_name.c_str(), same.worst_rel);
}

TrainerOptions trainer_options(const std::string& optimizer) {
  TrainerOptions o;
  o.optimizer = optimizer;
  o.optimizer_options.adam.lr = 3e-3f;
  o.optimizer_options.bucket_bytes = 4096;
  o.lr = LrSchedule{3e-3f, 3e-4f, 2, 10};
  return o;
}

// steps [from, to) of a trainer, the losses appended. Two batches in turn (0, 1, 0, ...),
// so that ten steps make a loss fall that a batch-to-batch spread would hide.
void train(Trainer& t, std::int64_t from, std::int64_t to, std::vector<double>& losses) {
  std::vector<std::int32_t> ids, tgt;
  for (std::int64_t step = from; step < to; ++step) {
    batch(step % 2, ids, tgt);
    const MicroBatch mb{ids.data(), tgt.data(), 2, 24};
    losses.push_back(t.step({&mb, 1}).loss);
  }
}

// FSDP's gradient reduce-scatter on its own thread (ModelSchedules::fsdp_reduce_thread)
// changes no bit: one step with every schedule on, f32 and bf16, gives the same loss and
// every FSDP gradient shard bitwise as the blocking reduce-scatter (the same collective, on
// another thread); the gather prefetch is on in both.
TEST(Precision, FsdpReduceThreadChangesNoBit) {
  for (const Precision p : {Precision::f32, Precision::bf16}) {
    ModelSchedules threaded = schedules(true, p);
    threaded.fsdp_reduce_thread = true;
    std::unique_ptr<ModelRun> a = make_run(schedules(true, p), 5);
    std::unique_ptr<ModelRun> b = make_run(threaded, 5);
    if (testing::world().size() > 1 && testing::world().concurrent_threads()) {
      EXPECT_TRUE(b->model->fsdp().reduces_in_background());
    }
    const double la = one_step(*a->model), lb = one_step(*b->model);
    EXPECT_EQ(la, lb) << precision_name(p);
    const FsdpUnits& fa = a->model->fsdp();
    const FsdpUnits& fb = b->model->fsdp();
    ASSERT_EQ(fa.shard_elements(), fb.shard_elements());
    for (std::uint64_t i = 0; i < fa.shard_elements(); ++i)
      ASSERT_EQ(float_bits(fa.grads_shard()[i]), float_bits(fb.grads_shard()[i])) << precision_name(p) << " " << i;
  }
}

// Two runs whose schedules differ only in something kept for the backward instead of
// computed again: the same losses, the same evaluation loss between the steps (an
// evaluation keeps nothing), every FSDP and store gradient bitwise after the second step.
void expect_kept_changes_no_bit(const ModelSchedules& base, const ModelSchedules& keep, const std::string& what) {
  std::unique_ptr<ModelRun> a = make_run(base, 5);
  std::unique_ptr<ModelRun> b = make_run(keep, 5);
  EXPECT_EQ(one_step(*a->model), one_step(*b->model)) << what;
  std::vector<std::int32_t> ids, tgt;
  batch(1, ids, tgt);
  EXPECT_EQ(a->model->forward(ids.data(), tgt.data(), 2, 24).ce, b->model->forward(ids.data(), tgt.data(), 2, 24).ce)
      << what;
  EXPECT_EQ(one_step(*a->model), one_step(*b->model)) << what;
  const FsdpUnits& fa = a->model->fsdp();
  const FsdpUnits& fb = b->model->fsdp();
  ASSERT_EQ(fa.shard_elements(), fb.shard_elements());
  for (std::uint64_t i = 0; i < fa.shard_elements(); ++i)
    ASSERT_EQ(float_bits(fa.grads_shard()[i]), float_bits(fb.grads_shard()[i])) << what << " " << i;
  const std::vector<ParameterStore*> sa = a->model->stores(), sb = b->model->stores();
  for (std::size_t k = 0; k < sa.size(); ++k)
    for (std::uint64_t i = 0; i < sa[k]->elements(); ++i)
      ASSERT_EQ(float_bits(sa[k]->grads_data()[i]), float_bits(sb[k]->grads_data()[i])) << what << " store " << k;
}

// Keeping every layer's attention output and log-sum-exp from the forward to its backward
// (ModelSchedules::keep_attention: the backward's recomputation skips the attention kernel)
// changes no bit: f32 and bf16, the stack's boundaries resident or offloaded (SCO, where the
// backward reads a boundary from another buffer than its forward did).
TEST(Precision, KeepAttentionChangesNoBit) {
  for (const Precision p : {Precision::f32, Precision::bf16})
    for (const bool offload : {false, true}) {
      ModelSchedules base = schedules(true, p);
      if (offload) base.checkpoint.resident_layers = 0;
      ModelSchedules keep = base;
      keep.keep_attention = true;
      expect_kept_changes_no_bit(base, keep, std::string(precision_name(p)) + (offload ? ", offloaded" : ", resident"));
    }
}

// Keeping the routed experts' forward for their backward (ModelSchedules::keep_experts:
// the backward runs no expert forward) changes no bit, the same way: f32 and bf16,
// resident and offloaded boundaries, the offloaded ones with the attention kept too.
TEST(Precision, KeepExpertsChangesNoBit) {
  for (const Precision p : {Precision::f32, Precision::bf16})
    for (const bool offload : {false, true}) {
      ModelSchedules base = schedules(true, p);
      if (offload) base.checkpoint.resident_layers = 0;
      base.keep_attention = offload;
      ModelSchedules keep = base;
      keep.keep_experts = true;
      expect_kept_changes_no_bit(base, keep, std::string(precision_name(p)) + (offload ? ", offloaded" : ", resident"));
    }
}

TEST(Precision, Bf16TrainsAndResumesBitwise) {
  Communicator& world = testing::world();
  std::unique_ptr<ModelRun> run = make_run(schedules(false, Precision::bf16), 5);
  ThreadPool pool(1);
  Trainer straight(*run->model, run->host, pool, trainer_options("device"));
  std::vector<double> losses;
  train(straight, 0, 5, losses);
  const std::uint64_t n = straight.shard_elements();
  std::vector<float> master(n), m(n), v(n);
  straight.read_shard(master.data(), m.data(), v.data());  // what a checkpoint keeps (fp32)
  const std::int64_t updates = straight.optimizer().steps_taken(), steps = straight.steps_taken();
  train(straight, 5, 10, losses);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses[8], losses[0]);  // the same batch
  EXPECT_LT(losses[9], losses[1]);

  // A fresh model (another init, overwritten by the restore) resumed at step 5.
  std::unique_ptr<ModelRun> again = make_run(schedules(false, Precision::bf16), 99);
  Trainer resumed(*again->model, again->host, pool, trainer_options("device"));
  resumed.restore(master.data(), m.data(), v.data(), updates, steps);
  std::vector<double> tail;
  train(resumed, 5, 10, tail);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tail[i], losses[5 + i]) << "step " << 6 + i;

  // OffloadStreamAdamW against the device AdamW, the model's schedules as they were: the
  // same update, the bf16 parameters narrowed alike, so the same losses bitwise.
  std::unique_ptr<ModelRun> streamed = make_run(schedules(false, Precision::bf16), 5);
  Trainer stream(*streamed->model, streamed->host, pool, trainer_options("offload_stream"));
  std::vector<double> stream_losses;
  train(stream, 0, 10, stream_losses);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(stream_losses[i], losses[i]) << "offload_stream, step " << i + 1;
  // Every schedule on (OffloadStreamAdamW too) against none: steps 1 and 2 (the loss after
  // the first update) within 1e-3. Later steps are reported only: AdamW's first updates
  // move an element by about lr x sign(g), so a gradient element near zero that a bf16 ulp
  // flip turns over moves the other way, and the runs drift apart by more than the
  // schedules' own difference (schedules_exact_mpi_test says the same of the BLAS kernels).
  std::unique_ptr<ModelRun> all = make_run(schedules(true, Precision::bf16), 5);
  Trainer offload(*all->model, all->host, pool, trainer_options("offload_stream"));
  std::vector<double> all_losses;
  train(offload, 0, 10, all_losses);
  double worst = 0, first_two = 0;
  for (int i = 0; i < 10; ++i) {
    const double e = std::abs(all_losses[i] - losses[i]) / std::abs(losses[i]);
    if (i < 2) {
      EXPECT_LE(e, 1e-3) << "step " << i + 1;
      first_two = std::max(first_two, e);
    }
    worst = std::max(worst, e);
  }
  if (world.rank() == 0)
    std::printf("bf16 copy task at %d ranks: loss %.6f -> %.6f (step 1 -> 9), resumed at 5 bitwise, offload_stream "
                "bitwise; all schedules vs none: steps 1-2 rel diff %.3g, 10 steps worst %.3g\n",
                world.size(), losses[0], losses[8], first_two, worst);
}

// The bf16 trainer's fp32 master is what the f32 trainer starts from, bitwise (from
// init_parameters and from load_hf of both Hugging Face fixtures), and the model computes
// with to_bf16 of it: the FSDP shard and every store (the slices all-gathered) bitwise.
// Two layouts: ep and the vocabulary group as wide as they go (the stores' replica groups
// of one rank), and ep = vocab = 1 (each store replicated on every rank, the trainer's
// slice of it 1/world).
TEST(Precision, Bf16MasterIsTheF32ModelsParameters) {
  Communicator& world = testing::world();
  const std::string fixtures = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/";
  for (const std::string source : {"init", "qwen3_moe", "mixtral"}) {
    for (bool wide : {true, false}) {
      SCOPED_TRACE(source + (wide ? " ep = vocab = wide" : " ep = vocab = 1"));
      const ModelConfig c =
          source == "init" ? testing::small_train_config("bf16-test") : load_hf_config(fixtures + source);
      ParallelLayout layout;
      layout.ep = wide ? world.size() : 1;
      while (c.num_experts % layout.ep != 0 || world.size() % layout.ep != 0) --layout.ep;
      layout.vocab = wide ? world.size() : 1;
      std::vector<float> master[2];
      std::unique_ptr<ModelRun> runs[2];
      ThreadPool pool(1);
      for (int k = 0; k < 2; ++k) {
        auto& r = runs[k];
        r = std::make_unique<ModelRun>();
        r->dev = std::make_unique<CpuDevice>(128 << 20);
        r->groups = ProcessGroups::split(world, layout);
        r->model = std::make_unique<MoeTransformer>(*r->dev, r->host, r->groups, c,
                                                    schedules(false, k ? Precision::bf16 : Precision::f32));
        if (source == "init")
          r->model->init_parameters(5);
        else
          r->model->load_hf(fixtures + source);
        Trainer t(*r->model, r->host, pool, trainer_options("device"));
        const std::uint64_t n = t.shard_elements();
        master[k].resize(n);
        std::vector<float> m(n), v(n);
        t.read_shard(master[k].data(), m.data(), v.data());
      }
      ASSERT_EQ(master[0].size(), master[1].size());
      EXPECT_EQ(0, std::memcmp(master[0].data(), master[1].data(), master[0].size() * sizeof(float)));
      // The compute copy: to_bf16 of the f32 model's parameters, bit for bit.
      auto expect_bf16_of = [](Device& d32, const float* p32, Device& d16, const void* p16, std::uint64_t n,
                               const char* what) {
        std::vector<float> a(n);
        std::vector<bf16> b(n);
        copy_to_host(d32, a.data(), p32, n * sizeof(float));
        copy_to_host(d16, b.data(), p16, n * sizeof(bf16));
        std::uint64_t bad = 0;
        for (std::uint64_t i = 0; i < n; ++i) bad += to_bf16(a[i]).bits != b[i].bits;
        EXPECT_EQ(bad, 0u) << what;
      };
      MoeTransformer& f = *runs[0]->model;
      MoeTransformer& h = *runs[1]->model;
      expect_bf16_of(*runs[0]->dev, f.fsdp().params_shard(), *runs[1]->dev, h.fsdp().params_shard_raw(),
                     f.fsdp().shard_elements(), "fsdp shard");
      for (std::size_t i = 0; i < f.stores().size(); ++i)
        expect_bf16_of(*runs[0]->dev, f.stores()[i]->params_data(), *runs[1]->dev, h.stores()[i]->params_raw(),
                       f.stores()[i]->elements(), i ? "head store" : "expert store");
    }
  }
}

TEST(Precision, Bf16TrainerNeedsAnInitializedModel) {
  Communicator& world = testing::world();
  ParallelLayout layout;
  layout.ep = 1;
  layout.vocab = 1;
  CpuDevice dev(64 << 20);
  HostMemory host;
  ProcessGroups groups = ProcessGroups::split(world, layout);
  MoeTransformer model(dev, host, groups, testing::small_train_config("bf16-test"), schedules(false, Precision::bf16));
  ThreadPool pool(1);
  try {
    Trainer t(model, host, pool, trainer_options("device"));
    FAIL() << "a bf16 model without init_parameters or load_hf was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("init_parameters or load_hf"), std::string::npos) << e.what();
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
