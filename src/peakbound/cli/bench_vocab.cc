// `peakbound bench vocab`: the materialized vocab-parallel cross-entropy and Ring-DTP
// on the same inputs in one run (under mpirun, P = the group size): each one's vocab
// peak from its Arena, its step time (forward + backward, best of --reps after a
// warm-up, max over ranks; the two alternate rep by rep), and how far Ring-DTP's loss
// and gradients are from the baseline's. --sweep repeats at 1/4, 1/2, 1, 2 and 4x the tokens. Ring-DTP runs
// through forward_backward (the fused 3-GEMM form at P = 1, forward + backward with
// the recomputing 4-GEMM backward at P > 1), the baseline through forward + backward.
// Each run also reports its GEMMs' FLOPs and seconds (VocabLoss::stats over the
// timed reps) beside its total seconds, so a gap is explained by numbers.
// --precision bf16 runs both in bf16 (hidden, W and d_hidden bf16 on the device, the
// trainer's form; errors against the bf16 baseline). --keep-logits adds a third run,
// Ring-DTP keeping the forward's logits blocks for the backward (3 GEMMs a block at
// P > 1), in the same alternation, with its own peak beside the recomputing one's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/vocab_flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/units.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/verify/vocab_reference.h"

namespace peakbound::cli {

namespace {

struct BenchVocabFlags : VocabFlags {
  int reps = 3;
  bool sweep = false;
  std::string precision = "f32";
  bool keep_logits = false;
  Precision prec() const { return parse_precision(precision, "--precision"); }
  // The options of a run: the shape flags', this precision, keeping the logits or not.
  VocabLossOptions run_options(bool keep) const {
    VocabLossOptions o = options();
    o.precision = prec();
    o.keep_logits = keep;
    return o;
  }
};

struct RunResult {
  std::string name, mode;
  std::uint64_t vocab_peak = 0;  // max over ranks
  std::uint64_t footprint_peak = 0;  // the footprint's, max over ranks
  double seconds = 0;            // best rep, max over ranks
  double mean_seconds = 0;       // mean rep, max over ranks (total time / reps)
  double gemm_flops = 0;         // per step, summed over ranks
  double gemm_seconds = 0;       // per step, mean over ranks
  double comm_seconds = 0;       // per step, mean over ranks
  // The device runs its ops inline (CPU): the host clock around a GEMM times the GEMM. On
  // an asynchronous device (CUDA) it times the launch, so the split is not reported.
  bool split_timed = true;
  double loss = 0;               // the group's summed loss
  std::vector<float> dh, dw;
};

// This rank's inputs: tokens and targets of its own, its vocabulary shard of W.
struct RankData {
  std::vector<float> hidden, weight;
  std::vector<std::int32_t> targets;
};

RankData make_rank_data(const VocabFlags& f, Communicator& g, std::int64_t tokens, std::int32_t ignore_index) {
  RankData d;
  VocabShard sh = vocab_shard(f.vocab, g.size(), g.rank());
  std::mt19937_64 rng(f.seed * 7919 + static_cast<std::uint64_t>(g.rank()));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<std::int32_t> td(0, static_cast<std::int32_t>(f.vocab - 1));
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  d.hidden.resize(static_cast<std::size_t>(tokens * f.hidden));
  for (auto& x : d.hidden) x = nd(rng);
  d.targets.resize(static_cast<std::size_t>(tokens));
  for (auto& t : d.targets) t = ud(rng) < f.ignore_fraction ? ignore_index : td(rng);
  d.weight.resize(static_cast<std::size_t>(sh.rows * f.hidden));
  const float ws = 2.0f / std::sqrt(static_cast<float>(f.hidden));
  for (auto& x : d.weight) x = nd(rng) * ws;
  return d;
}

double group_sum(Communicator& g, double v) {
  // Gathered and summed in rank order, so every rank gets the same bits.
  std::vector<double> all(static_cast<std::size_t>(g.size()));
  g.all_gather(&v, all.data(), 1, DType::f64);
  double s = 0;
  for (double x : all) s += x;
  return s;
}

// One implementation on its own device, stepped by measure(): the runs take turns rep
// by rep, so a change of load on a shared machine falls on all alike.
class Runner {
 public:
  Runner(const BenchVocabFlags& f, Communicator& g, const RankData& d, std::int64_t tokens, bool ring, bool keep)
      : g_(g), tokens_(tokens), ring_(ring), prec_(f.prec()), fp_(footprint(f, g, tokens, ring, keep)) {
    // The loss's own buffers (the budget from its footprint) plus this rank's inputs and
    // gradients, which live on the device as in a model.
    const std::int64_t H = f.hidden, rows = vocab_shard(f.vocab, g.size(), g.rank()).rows;
    const std::uint64_t io = VocabRankOnDevice::bytes(tokens, H, rows, prec_);
    dev_ = make_device(f.device, f.device_budget({fp_}, io),
                       std::string("cpu:") + (ring ? (keep ? "ring-kept" : "ring") : "materialized"));
    gpu_group_ = device_group_for(*dev_, g);
    Communicator& group = gpu_group_ ? *gpu_group_ : g;
    impl_ = ring ? make_ring_dtp_vocab_loss(*dev_, group, f.dims(), f.run_options(keep))
                 : make_materialized_vocab_loss(*dev_, group, f.dims(), f.run_options(false));
    on_ = std::make_unique<VocabRankOnDevice>(*dev_, d.hidden.data(), d.targets.data(), tokens, H, d.weight.data(),
                                              rows, prec_);
    dw_floats_ = static_cast<std::int64_t>(d.weight.size());
    r_.name = impl_->name() + (keep ? " (kept logits)" : "");
    r_.dh.assign(d.hidden.size(), 0.0f);
    r_.dw.assign(d.weight.size(), 0.0f);
    r_.seconds = std::numeric_limits<double>::infinity();
  }

  // The untimed warm-up: first touch of fresh memory is many times slower here.
  void warm_up() {
    step();
    impl_->reset_stats();
    steps_ = 0;
    busy_ = 0;
  }

  // One rep, timed across the group (as long as its slowest rank).
  void timed_rep() {
    bench::Stopwatch w;
    r_.seconds = std::min(r_.seconds, bench::best_group_seconds(g_, [&] { step(); }, 1));
    busy_ += w.seconds();
  }

  RunResult finish() {
    const double n = std::max(steps_, 1);
    double mean = busy_ / n;
    g_.all_reduce(&mean, 1, DType::f64, ReduceOp::max);
    r_.mean_seconds = mean;
    double st[3] = {impl_->stats().gemm_flops / n, impl_->stats().gemm_seconds / n, impl_->stats().comm_seconds / n};
    g_.all_reduce(st, 3, DType::f64, ReduceOp::sum);
    r_.gemm_flops = st[0];
    r_.gemm_seconds = st[1] / g_.size();
    r_.comm_seconds = st[2] / g_.size();
    r_.split_timed = dev_->backend() == Backend::cpu;
    r_.dh = on_->d_hidden_floats(*dev_, static_cast<std::int64_t>(r_.dh.size()));
    copy_to_host(*dev_, r_.dw.data(), on_->d_weight.data(), r_.dw.size() * 4);
    std::int64_t peak = static_cast<std::int64_t>(dev_->arena().peak(Component::vocab));
    g_.all_reduce(&peak, 1, DType::i64, ReduceOp::max);
    r_.vocab_peak = static_cast<std::uint64_t>(peak);
    std::int64_t fp_peak = static_cast<std::int64_t>(fp_.device_peak(Component::vocab));
    g_.all_reduce(&fp_peak, 1, DType::i64, ReduceOp::max);
    r_.footprint_peak = static_cast<std::uint64_t>(fp_peak);
    r_.mode = impl_->mode_used();
    r_.loss = group_sum(g_, ls_.loss);
    return r_;
  }

 private:
  // Ring-DTP runs through forward_backward (fused at P = 1), the baseline through
  // forward + backward. The device holds only the loss's own buffers.
  static Footprint footprint(const BenchVocabFlags& f, Communicator& g, std::int64_t tokens, bool ring, bool keep) {
    VocabLossShape shape;
    shape.tokens = gather_token_counts(g, tokens);
    shape.dims = f.dims();
    shape.rank = g.rank();
    return ring ? ring_dtp_step_footprint(shape, f.run_options(keep), f.prec())
                : materialized_vocab_footprint(shape, f.run_options(false), f.prec());
  }

  void step() {
    float* dw = on_->d_weight.as<float>();
    if (dw_floats_) ops::fill(*dev_, dev_->compute_stream(), dw, dw_floats_, 0.0f);
    if (prec_ == Precision::bf16)
      step_as(on_->hidden.as<bf16>(), on_->weight.as<bf16>(), on_->d_hidden.as<bf16>(), dw);
    else
      step_as(on_->hidden.as<float>(), on_->weight.as<float>(), on_->d_hidden.as<float>(), dw);
    dev_->synchronize();
    ++steps_;
  }
  template <class A>
  void step_as(const A* h, const A* w, A* dh, float* dw) {
    const std::int32_t* t = on_->targets.as<std::int32_t>();
    if (ring_) {
      ls_ = impl_->forward_backward(h, t, tokens_, w, 1.0f, dh, dw);
    } else {
      ls_ = impl_->forward(h, t, tokens_, w);
      impl_->backward(1.0f, dh, dw);
    }
  }

  Communicator& g_;
  std::int64_t tokens_;
  bool ring_;
  Precision prec_;
  Footprint fp_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Communicator> gpu_group_;  // NCCL over a duplicate of g_ on a GPU
  std::unique_ptr<VocabLoss> impl_;
  std::unique_ptr<VocabRankOnDevice> on_;  // this rank's inputs and gradients
  std::int64_t dw_floats_ = 0;
  RunResult r_;
  LossSum ls_;
  int steps_ = 0;
  double busy_ = 0;  // seconds of the timed reps (barriers included)
};

nlohmann::json measure(const BenchVocabFlags& f, Communicator& g, std::int64_t tokens) {
  RankData d = make_rank_data(f, g, tokens, VocabLossOptions{}.ignore_index);
  Runner base_run(f, g, d, tokens, false, false), ring_run(f, g, d, tokens, true, false);
  std::unique_ptr<Runner> kept_run;
  if (f.keep_logits) kept_run = std::make_unique<Runner>(f, g, d, tokens, true, true);
  base_run.warm_up();
  ring_run.warm_up();
  if (kept_run) kept_run->warm_up();
  for (int i = 0; i < f.reps; ++i) {  // alternating, so all see the same load
    base_run.timed_rep();
    ring_run.timed_rep();
    if (kept_run) kept_run->timed_rep();
  }
  const RunResult base = base_run.finish();
  const RunResult ring = ring_run.finish();
  const RunResult kept = kept_run ? kept_run->finish() : RunResult{};
  const double total_tokens = static_cast<double>(tokens) * g.size();
  nlohmann::json runs = nlohmann::json::array();
  std::vector<const RunResult*> all{&base, &ring};
  if (kept_run) all.push_back(&kept);
  for (const RunResult* r : all) {
    runs.push_back({{"name", r->name}, {"mode", r->mode}, {"vocab_peak_bytes", r->vocab_peak},
                    {"footprint_vocab_peak_bytes", r->footprint_peak},
                    {"seconds", r->seconds}, {"mean_seconds", r->mean_seconds},
                    {"tokens_per_second", total_tokens / r->seconds},
                    // per step: the group's GEMM FLOPs (and GFLOP/s over the whole step)
                    {"gemm_flops", r->gemm_flops},
                    {"step_gflops_per_rank", r->gemm_flops / g.size() / r->seconds / 1e9}});
    // A rank's mean seconds in GEMMs, in communication calls (waits included) and in the
    // rest (elementwise work): where the host clock times the ops (RunResult::split_timed).
    if (r->split_timed) {
      runs.back()["gemm_seconds_per_rank"] = r->gemm_seconds;
      runs.back()["comm_seconds_per_rank"] = r->comm_seconds;
      runs.back()["other_seconds"] = r->mean_seconds - r->gemm_seconds - r->comm_seconds;
    }
  }
  nlohmann::json j;
  j["tokens_per_rank"] = tokens;
  j["runs"] = runs;
  j["peak_reduction"] = 1.0 - static_cast<double>(ring.vocab_peak) / static_cast<double>(base.vocab_peak);
  j["throughput_ratio"] = base.seconds / ring.seconds;
  j["throughput_ratio_mean"] = base.mean_seconds / ring.mean_seconds;  // of the mean reps: less luck, more load
  // GFLOP/s of one rank's GEMMs (the group's FLOPs per rank over a rank's GEMM seconds).
  auto gflops = [&](const RunResult& r) { return r.gemm_flops / g.size() / std::max(r.gemm_seconds, 1e-30) / 1e9; };
  if (base.split_timed && ring.split_timed) {
    j["gemm_gflops_baseline"] = gflops(base);
    j["gemm_gflops_ring"] = gflops(ring);
    j["gemm_gflops_ratio"] = gflops(ring) / std::max(gflops(base), 1e-30);
  } else {
    j["time_split"] = "not measured: on an asynchronous device the host clock around an op times its launch";
  }
  j["gemm_flops_ratio"] = ring.gemm_flops / std::max(base.gemm_flops, 1.0);
  j["seconds_baseline"] = base.seconds;
  j["seconds_ring"] = ring.seconds;
  j["max_rel_err_loss"] = std::fabs(ring.loss - base.loss) / std::max(std::fabs(base.loss), 1e-30);
  j["max_rel_err_dhidden"] = bench::group_relative_error(g, ring.dh, base.dh);
  j["max_rel_err_dweight"] = bench::group_relative_error(g, ring.dw, base.dw);
  if (kept_run) {
    // The kept form against the recomputing one: the same products on the same operands,
    // so the same bits (0 differences expected), at a peak that holds the logits.
    nlohmann::json k;
    k["throughput_ratio_vs_recompute"] = ring.seconds / kept.seconds;
    k["throughput_ratio_mean_vs_recompute"] = ring.mean_seconds / kept.mean_seconds;
    k["throughput_ratio_vs_baseline"] = base.seconds / kept.seconds;
    k["peak_reduction_vs_baseline"] = 1.0 - static_cast<double>(kept.vocab_peak) / static_cast<double>(base.vocab_peak);
    k["gemm_flops_ratio_vs_recompute"] = kept.gemm_flops / std::max(ring.gemm_flops, 1.0);
    k["same_loss_bits"] = kept.loss == ring.loss;
    k["max_rel_err_dhidden_vs_recompute"] = bench::group_relative_error(g, kept.dh, ring.dh);
    k["max_rel_err_dweight_vs_recompute"] = bench::group_relative_error(g, kept.dw, ring.dw);
    j["kept_logits"] = k;
  }
  return j;
}

Command add_bench_vocab(CLI::App& parent) {
  auto f = std::make_shared<BenchVocabFlags>();
  Command c;
  c.collective = true;  // every rank of the vocabulary or expert-parallel group takes part
  c.app = parent.add_subcommand("vocab", "Ring-DTP vs the materialized vocab-parallel cross-entropy (run under mpirun)");
  f->add_to(*c.app);
  int_flag(c.app, "--reps", f->reps, "Timed repetitions after one warm-up (best is kept)", 1, 100);
  c.app->add_flag("--sweep", f->sweep, "Also measure at 1/4, 1/2, 2 and 4x the tokens");
  text_flag(c.app, "--precision", f->precision,
            "f32 or bf16: both losses' precision (bf16: hidden, W and d_hidden bf16, as the trainer runs)")
      ->capture_default_str();
  c.app->add_flag("--keep-logits", f->keep_logits,
                  "Also run Ring-DTP keeping the forward's logits blocks for the backward (3 GEMMs a block at P > 1), "
                  "alternating with the other two");
  // Everything a rank can check alone, with the launcher's group size: every rank agrees,
  // so a bad input is one line from rank 0 and a non-zero exit everywhere.
  c.validate = [f] {
    const int P = launcher_size();
    if (f->keep_logits && P == 1)
      throw InvalidArgument(
          "--keep-logits: one rank takes Ring-DTP's fused form, which makes each gradient block in the forward and "
          "keeps nothing; run the group under mpirun (2 or more ranks)");
    for (double m : f->sweep ? std::vector<double>{0.25, 0.5, 1.0, 2.0, 4.0} : std::vector<double>{1.0})
      for (int r = 0; r < P; ++r) {
        const auto shape = VocabLossShape::uniform(static_cast<std::int64_t>(static_cast<double>(f->tokens) * m), f->dims(), P, r);
        f->check_budget({materialized_vocab_footprint(shape, f->run_options(false), f->prec()),
                         ring_dtp_step_footprint(shape, f->run_options(false), f->prec()),
                         ring_dtp_step_footprint(shape, f->run_options(f->keep_logits), f->prec())},
                        r);
      }
  };
  c.run = [f] {
    auto world = world_communicator();
    Communicator& g = *world;
    bench::share_cores_among_local_ranks();
    nlohmann::json j = measure(*f, g, f->tokens);
    if (f->sweep) {
      nlohmann::json sweep = nlohmann::json::array();
      for (double m : {0.25, 0.5, 1.0, 2.0, 4.0}) {
        auto t = static_cast<std::int64_t>(static_cast<double>(f->tokens) * m);
        nlohmann::json s = m == 1.0 ? j : measure(*f, g, t);
        sweep.push_back({{"tokens_per_rank", t},
                         {"materialized_vocab_peak_bytes", s["runs"][0]["vocab_peak_bytes"]},
                         {"ring_dtp_vocab_peak_bytes", s["runs"][1]["vocab_peak_bytes"]},
                         {"peak_reduction", s["peak_reduction"]},
                         {"throughput_ratio", s["throughput_ratio"]}});
      }
      j["sweep"] = sweep;
    }
    if (g.rank() == 0) {
      nlohmann::json out = {{"bench", "vocab"}, {"device", f->device},
                            {"ranks", g.size()},
                            {"tokens_per_rank", f->tokens},
                            {"hidden", f->hidden},
                            {"vocab", f->vocab},
                            {"chunk", f->chunk},
                            {"mode_requested", f->mode},
                            {"z_loss", f->z_loss},
                            {"precision", f->precision},
                            {"bf16_gemm_path", ops::bf16_gemm_path()},
                            {"backward", g.size() == 1 ? "fused (3 GEMMs per token block, forward_backward)"
                                                       : "recompute (4 GEMMs per token block)"},
                            {"load_average", bench::load_average()},
                            {"machine", bench::machine_info()}};
      out.update(j);
      std::printf("%s\n", out.dump(2).c_str());
    }
    return 0;
  };
  return c;
}

const bool registered = register_command("bench", "vocab", &add_bench_vocab);

}  // namespace

}  // namespace peakbound::cli
