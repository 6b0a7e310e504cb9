// `peakbound bench attention`: the CPU flash attention kernel (ops/host_attention.h)
// alone on one sequence, forward and backward timed separately (best of --reps after a
// warm-up), as GFLOP/s of the causal block products: forward 2 P Hq (D + Dv), backward
// 2 P Hq (3 D + 2 Dv) (S recomputed, dP, dV, dK, dQ), P = T (T + 1) / 2 visible pairs
// (with --window W: sum over rows of min(i + 1, W)). The tiles each pass computes per head
// (kernels/attention_dims.h attention_tiles, the kernel's own loop bounds) are printed
// beside the causal kernel's; with a window the causal kernel is timed too, so the time
// saved by skipping (not masking) the blocks outside the window is measured in one run.
// Under mpirun only rank 0 runs the kernel part (the others wait). --precision bf16 times
// the kernel on bf16 q, k, v, dout and out (the trainer's bf16 attention: tile products on
// the process's bf16 GEMM path, printed as bf16_gemm_path; PEAKBOUND_BF16_GEMM picks
// another), f32 the f32 kernel; the ring part below is f32 either way.
//
// Then ring attention (schedules/ring_attention.h) on the same --seq-len sequence for each
// CP of --cp-sizes that divides the launched ranks: ONE group, ranks 0..CP-1, runs while
// the others wait in a barrier (so CP 1 is one rank alone, not W copies fighting for the
// cores). Per CP:
//   peak_bytes     the arena's peak of component attention on a rank (the max over the
//                  group) through one forward + backward with q, k, v, dout, out, lse,
//                  dq, dk, dv allocated from the arena under that component too.
//   step_seconds   forward + backward wall time, the slowest rank of each rep (reps
//                  bracketed by group barriers), median of --reps after one warm-up.
//   overlap_fraction (per CP, CP > 1 only): 1 - exposed_comm / alone, clamped to [0, 1]:
//                  the share of the ring's communication time hidden behind compute.
//                  alone = the wall time of the same forward + backward with every
//                  kernel skipped (RingAttentionStats::communication_only: the same
//                  transfers, fills and adds, no compute to hide behind).
//                  exposed_comm = the time a rank sat blocked in the ring's waits after
//                  its own compute was done AND after the previous rank had posted the
//                  data waited for (RingAttentionStats: each wait's start and end against
//                  the sender's post time; one host's processes share the clock). Time
//                  blocked before the sender posted is load imbalance (a slower
//                  neighbour, cores shared by oversubscribed ranks or other jobs):
//                  reported as imbalance_seconds, not counted against the overlap.
//                  exposed_seconds = wall - kernel busy time is reported too (it holds
//                  both, plus host overheads). Medians over reps of the slowest rank.
//   ring_tiles     the [Bq x Bk] score tiles per head the group's kernel calls compute
//                  (ring_attention_tiles summed over the ranks), forward and backward,
//                  beside the causal ring's (window 0): what --window skips under CP.
//   max_rel_err    ring vs the single-rank kernel on the whole sequence (out, lse, dq,
//                  dk, dv at the zigzag rows), the worst over the CP sizes.
// With --piece-tokens N (N > 0) each CP > 1 runs a second time carrying pieces of N tokens
// (RingAttentionConfig::piece_tokens, what the attention layer does with kRingPieceTokens),
// the same measurements side by side under "pieces": its passes, peak_bytes,
// step_seconds, exposed_comm_seconds, imbalance_seconds, and its max_rel_err.
// Per CP > 1 where cp can split the heads (schedules/ulysses_attention.h), Ulysses runs on
// the same group after the ring, under "ulysses": its peak_bytes, step_seconds and
// max_rel_err measured the same way, and the most bytes a rank sends in a forward +
// backward under each schedule (bytes_sent, ring_bytes_sent: the traffic functions).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/attention_flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
#include "peakbound/core/precision.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/ops/host_attention.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/schedules/ulysses_attention.h"
#include "peakbound/verify/attention_reference.h"

namespace peakbound::cli {

namespace {

struct BenchAttentionFlags {
  // The tiles default to the kernel's (what training runs).
  std::int64_t tokens = 2048, heads = 8, kv_heads = 2, dim = 64, block_q = AttentionDims{}.block_q,
               block_k = AttentionDims{}.block_k, window = 0;
  int threads = 1, reps = 3;
  std::string cp_sizes = "1,2,4", precision = "f32";
  std::int64_t piece_tokens = 0;
  bool json = true;
};

// A barrier over the world that sleeps: the ranks with nothing to do (outside the CP
// group, or while rank 0 times the kernel) wait here without spinning a core the
// working ranks need (an MPI barrier polls).
void sleepy_barrier(Communicator& w) {
  if (w.size() == 1) return;
  constexpr int kTag = 97;
  auto wait = [](Request& r) {
    while (!r.test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::int32_t token = 0;
  if (w.rank() == 0) {
    std::vector<std::int32_t> in(static_cast<std::size_t>(w.size()));
    for (int r = 1; r < w.size(); ++r) {
      Request q = w.irecv(&in[static_cast<std::size_t>(r)], 1, DType::i32, r, kTag);
      wait(q);
    }
    for (int r = 1; r < w.size(); ++r) w.send(&token, 1, DType::i32, r, kTag + 1);
  } else {
    std::int32_t back = 0;
    Request out = w.isend(&token, 1, DType::i32, 0, kTag);
    Request in = w.irecv(&back, 1, DType::i32, 0, kTag + 1);
    wait(in);
    out.wait();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

struct CpResult {
  int passes = 1;  // round the ring (ring_attention_pieces)
  std::uint64_t peak_bytes = 0;
  double step_seconds = 0, exposed_seconds = 0, exposed_comm_seconds = 0, imbalance_seconds = 0, alone_seconds = 0,
         compute_seconds = 0, rel_err = 0;
};

// One CP size on group g (the ranks 0..CP-1 of the world): see the file comment.
CpResult run_cp(Communicator& g, const AttentionDims& a, const AttentionProblem& p, const AttentionResult& ref,
                int reps, ThreadPool* pool, std::int64_t piece_tokens,
                ContextAttention kind = ContextAttention::ring) {
  const bool ulysses = kind == ContextAttention::ulysses;
  const int cp = g.size();
  RingAttentionConfig cfg;
  cfg.dims = a;
  cfg.seq_len = a.tokens;
  cfg.piece_tokens = piece_tokens;
  const CpShard sh = zigzag_shard(a.tokens, cp, g.rank());
  const std::int64_t T = sh.tokens();
  const std::int64_t wq = a.q_heads * a.qk_dim, wk = a.kv_heads * a.qk_dim, wv = a.kv_heads * a.v_dim,
                     wo = a.q_heads * a.v_dim, wl = a.q_heads;
  CpuDevice dev(ring_attention_device_budget(cfg, cp, ulysses));
  CpResult res;
  res.passes = ulysses ? 1 : ring_attention_pieces(cfg, cp);
  // Exactness and the peak: one forward + backward with every tensor under attention.
  {
    const RingAttentionCheck c =
        verify_ring_attention(dev, g, p, ref, ref, Component::attention, pool, piece_tokens, 1, kind);
    res.rel_err = c.worst_kernel();
    std::uint64_t peak = std::max(c.forward_peak, c.backward_peak);
    g.all_reduce(&peak, 1, DType::i64, ReduceOp::max);
    res.peak_bytes = peak;
  }
  // Timing on this rank's rows (values do not matter for time; the problem's are used).
  auto alloc = [&](std::int64_t w) { return dev.allocate(Component::attention, static_cast<std::uint64_t>(T * w) * sizeof(float)); };
  Buffer q = alloc(wq), k = alloc(wk), v = alloc(wv), dout = alloc(wo), out = alloc(wo), lse = alloc(wl), dq = alloc(wq),
         dk = alloc(wk), dv = alloc(wv);
  auto fill_rows = [&](Buffer& b, const std::vector<float>& x, std::int64_t w) {
    std::vector<float> rows(static_cast<std::size_t>(T * w));
    for (std::int64_t t = 0; t < T; ++t) std::copy_n(x.begin() + sh.position(t) * w, w, rows.begin() + t * w);
    copy_to_device(dev, b.data(), rows.data(), rows.size() * sizeof(float));
  };
  fill_rows(q, p.q, wq);
  fill_rows(k, p.k, wk);
  fill_rows(v, p.v, wv);
  fill_rows(dout, p.dout, wo);
  auto step = [&](RingAttentionStats* fs, RingAttentionStats* bs) {
    if (ulysses) {  // no stats: nothing of it overlaps (all-to-all, then the kernel, then all-to-all)
      ulysses_attention_forward(dev, g, cfg, out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(),
                                v.as<float>(), pool);
      ulysses_attention_backward(dev, g, cfg, dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(),
                                 q.as<float>(), k.as<float>(), v.as<float>(), out.as<float>(), lse.as<float>(), nullptr,
                                 pool);
      return;
    }
    ring_attention_forward(dev, g, cfg, out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(),
                           pool, fs);
    ring_attention_backward(dev, g, cfg, dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(),
                            q.as<float>(), k.as<float>(), v.as<float>(), out.as<float>(), lse.as<float>(), nullptr, pool,
                            bs);
  };
  // The slowest rank's value of x (every rank gets it).
  auto slowest = [&](double x) {
    g.all_reduce(&x, 1, DType::f64, ReduceOp::max);
    return x;
  };
  step(nullptr, nullptr);  // warm-up (first touch of the ring buffers)
  std::vector<double> steps, exposed, exposed_comm, imbalance, compute, alone;
  for (int i = 0; i < reps; ++i) {
    RingAttentionStats fs, bs;
    g.barrier();
    bench::Stopwatch w;
    step(&fs, &bs);
    const double t = w.seconds();
    steps.push_back(slowest(t));
    exposed.push_back(slowest(fs.exposed_seconds + bs.exposed_seconds));
    compute.push_back(slowest(fs.compute_seconds + bs.compute_seconds));
    exposed_comm.push_back(slowest(fs.exposed_comm_seconds + bs.exposed_comm_seconds));
    imbalance.push_back(slowest(fs.imbalance_seconds + bs.imbalance_seconds));
  }
  if (cp > 1 && !ulysses)
    for (int i = 0; i < reps; ++i) {
      RingAttentionStats fs, bs;
      fs.communication_only = bs.communication_only = true;
      g.barrier();
      step(&fs, &bs);
      alone.push_back(slowest(fs.wall_seconds + bs.wall_seconds));
    }
  res.step_seconds = median(steps);
  res.exposed_seconds = median(exposed);
  res.compute_seconds = median(compute);
  res.exposed_comm_seconds = median(exposed_comm);
  res.imbalance_seconds = median(imbalance);
  res.alone_seconds = median(alone);
  return res;
}

nlohmann::json kernel_part(const BenchAttentionFlags& fl, bool run) {
  if (!run) return {};
  const BenchAttentionFlags* f = &fl;
  AttentionDims a;
  a.tokens = f->tokens;
  a.q_heads = f->heads;
  a.kv_heads = f->kv_heads;
  a.qk_dim = a.v_dim = f->dim;
  a.block_q = f->block_q;
  a.block_k = f->block_k;
  a.threads = f->threads;
  a.window = f->window;
  const auto T = static_cast<std::size_t>(a.tokens);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rnd = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const auto q = rnd(T * a.q_heads * a.qk_dim), k = rnd(T * a.kv_heads * a.qk_dim), v = rnd(T * a.kv_heads * a.v_dim),
             dout = rnd(T * a.q_heads * a.v_dim);
  const bool low = parse_precision(f->precision, "--precision") == Precision::bf16;
  const DType storage = low ? DType::bf16 : DType::f32;
  std::vector<float> out(dout.size()), lse(T * a.q_heads), dq(q.size()), dk(k.size()), dv(v.size()),
      ws(static_cast<std::size_t>(attention_workspace_floats(a, storage)));
  // bf16: the operands rounded once; out_low is the forward's out rounded (as the trainer
  // stores it), refreshed after each forward the backward reads.
  const auto rounded = [](const std::vector<float>& x) {
    std::vector<bf16> r(x.size());
    ops::host_to_bf16(r.data(), x.data(), static_cast<std::int64_t>(x.size()));
    return r;
  };
  const std::vector<bf16> q_low = low ? rounded(q) : std::vector<bf16>{},
                          k_low = low ? rounded(k) : std::vector<bf16>{},
                          v_low = low ? rounded(v) : std::vector<bf16>{},
                          dout_low = low ? rounded(dout) : std::vector<bf16>{};
  std::vector<bf16> out_low;
  std::optional<ThreadPool> pool;
  if (a.threads > 1) pool.emplace(a.threads);
  ThreadPool* p = pool ? &*pool : nullptr;
  // The tile GEMMs on one BLAS thread, as the trainer runs the kernel (one rank a core, the
  // kernel's shares on --threads cores): left to the process's BLAS threads (the machine's
  // cores in one process), OpenBLAS split the 128 x 128 tile products over them and its
  // waiting threads' yields cost more than the split gained (2-core Xeon, head dim 32,
  // bf16: forward 0.23 s against 0.14 s on one BLAS thread).
  const ops::BlasThreadsScope one_blas_thread(1);
  const std::string load_before = bench::load_average();
  // The forward's and then the backward's best time under dims d (the backward reads the
  // forward's out and lse).
  const auto time_passes = [&](const AttentionDims& d) {
    const double fw = bench::best_seconds(
        [&] {
          if (low)
            ops::host_attention_forward(out.data(), lse.data(), q_low.data(), k_low.data(), v_low.data(), d,
                                        ws.data(), p);
          else
            ops::host_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d, ws.data(), p);
        },
        1, f->reps);
    if (low) out_low = rounded(out);
    const double bw = bench::best_seconds(
        [&] {
          if (low)
            ops::host_attention_backward(dq.data(), dk.data(), dv.data(), dout_low.data(), q_low.data(),
                                         k_low.data(), v_low.data(), out_low.data(), lse.data(), d, ws.data(), p);
          else
            ops::host_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                         out.data(), lse.data(), d, ws.data(), p);
        },
        1, f->reps);
    return std::pair{fw, bw};
  };
  const auto [fwd, bwd] = time_passes(a);
  // Visible (query, key) pairs: T (T + 1) / 2 causal; with a window W, row i sees min(i + 1, W).
  const double Tn = static_cast<double>(a.tokens), Wn = static_cast<double>(std::min(a.window, a.tokens));
  const double pairs = a.window > 0 ? Wn * (Wn + 1) / 2.0 + (Tn - Wn) * Wn : Tn * (Tn + 1) / 2.0;
  const double hq = static_cast<double>(a.q_heads), d = static_cast<double>(a.qk_dim), dvd = static_cast<double>(a.v_dim);
  const double fwd_flops = 2.0 * pairs * hq * (d + dvd), bwd_flops = 2.0 * pairs * hq * (3.0 * d + 2.0 * dvd);
  nlohmann::json j = {{"bench", "attention"},
                      {"tokens", a.tokens},
                      {"q_heads", a.q_heads},
                      {"kv_heads", a.kv_heads},
                      {"head_dim", a.qk_dim},
                      {"block_q", a.block_q},
                      {"block_k", a.block_k},
                      {"threads", a.threads},
                      {"kernel_blas_threads", ops::blas_num_threads()},
                      {"window", a.window},
                      {"precision", low ? "bf16" : "f32"},
                      {"bf16_gemm_path", low ? ops::bf16_gemm_path() : std::string("none")},
                      {"workspace_floats", attention_workspace_floats(a, storage)},
                      {"forward_seconds", fwd},
                      {"backward_seconds", bwd},
                      {"forward_gflops", fwd_flops / fwd * 1e-9},
                      {"backward_gflops", bwd_flops / bwd * 1e-9},
                      {"load_average_before", load_before},
                      {"load_average_after", bench::load_average()},
                      {"machine", bench::machine_info()}};
  // What the window saves: the [Bq x Bk] tiles each pass computes per head against the
  // causal kernel's (window 0) on the same shape, and that kernel's times side by side.
  AttentionDims causal = a;
  causal.window = 0;
  const AttentionTiles tiles = attention_tiles(a), full = attention_tiles(causal);
  j["forward_tiles"] = tiles.forward;
  j["backward_tiles"] = tiles.backward;
  j["causal_forward_tiles"] = full.forward;
  j["causal_backward_tiles"] = full.backward;
  j["window_skipped_tile_fraction"] =
      1.0 - static_cast<double>(tiles.forward + tiles.backward) / static_cast<double>(full.forward + full.backward);
  if (a.window > 0) {
    const auto [causal_fwd, causal_bwd] = time_passes(causal);
    j["causal_forward_seconds"] = causal_fwd;
    j["causal_backward_seconds"] = causal_bwd;
  }
  return j;
}

Command add_bench_attention(CLI::App& parent) {
  auto f = std::make_shared<BenchAttentionFlags>();
  Command c;
  c.app = parent.add_subcommand("attention", "The CPU flash attention kernel: forward and backward GFLOP/s");
  int_flag(c.app, "--seq-len,--tokens", f->tokens, "Sequence length T (--tokens: the old name)", 1, 32768);
  int_flag(c.app, "--heads", f->heads, "Query heads Hq", 1, 256);
  int_flag(c.app, "--kv-heads", f->kv_heads, "Key/value heads Hkv (divides --heads)", 1, 256);
  int_flag(c.app, "--dim", f->dim, "Head dimension D = Dv", 1, 1024);
  int_flag(c.app, "--block-q", f->block_q, "Query rows per tile", 1, 4096);
  int_flag(c.app, "--block-k", f->block_k, "Keys per tile", 1, 4096);
  int_flag(c.app, "--window", f->window,
           "Sliding window in keys (0: full causal); the kernel and the ring skip the blocks outside it, and the "
           "kernel part prints the tiles computed against the causal kernel's and both kernels' times",
           0, 1 << 30);
  int_flag(c.app, "--threads", f->threads, "Threads (a pool of this size; 1: the caller only)", 1, 256);
  int_flag(c.app, "--reps", f->reps, "Timed repetitions after one warm-up (best is kept; ring: the median)", 1, 100);
  text_flag(c.app, "--cp-sizes", f->cp_sizes,
            "Ring attention over CP ranks for each size, comma-separated; sizes not dividing the launched ranks are "
            "skipped");
  text_flag(c.app, "--precision", f->precision,
            "f32 or bf16: the kernel part's storage (bf16: the trainer's bf16 kernel on the process's bf16 GEMM path; "
            "the ring part is f32)")
      ->capture_default_str();
  int_flag(c.app, "--piece-tokens", f->piece_tokens,
           "Also run each CP > 1 carrying K/V and dK/dV in pieces of this many tokens (0: not)", 0, 1 << 30);
  c.app->add_flag("--json", f->json, "Print one JSON object (the only output this benchmark has)");
  c.collective = true;  // the ring part runs on a group of the launched ranks
  c.validate = [f] {
    (void)parse_precision(f->precision, "--precision");
    for (std::int64_t cp : int_list(f->cp_sizes, "--cp-sizes", 1, 4096))
      if (launcher_size() % cp == 0) check_context_split(cp, f->tokens, "--seq-len");
    if (f->heads % f->kv_heads != 0)
      throw InvalidArgument("--kv-heads " + std::to_string(f->kv_heads) + " does not divide --heads " +
                            std::to_string(f->heads));
    // q, dq, out, dout [T, Hq, D] and k, v, dk, dv [T, Hkv, D], held in host vectors.
    const double floats = 4.0 * static_cast<double>(f->tokens) * static_cast<double>(f->heads + f->kv_heads) *
                          static_cast<double>(f->dim);
    if (floats > 1073741824.0)
      throw InvalidArgument("--seq-len x (--heads + --kv-heads) x --dim needs " + std::to_string(floats * 4 / 1073741824.0) +
                            " GiB of tensors; this benchmark keeps them under 4 GiB");
  };
  c.run = [f] {
    auto world = world_communicator();
    Communicator& w = *world;
    nlohmann::json j = kernel_part(*f, w.rank() == 0);
    sleepy_barrier(w);
    if (w.size() > 1) bench::share_cores_among_local_ranks();
    // The ring part.
    AttentionDims a;
    a.tokens = f->tokens;
    a.q_heads = f->heads;
    a.kv_heads = f->kv_heads;
    a.qk_dim = a.v_dim = f->dim;
    a.block_q = f->block_q;
    a.block_k = f->block_k;
    a.threads = f->threads;
    a.window = f->window;
    std::optional<ThreadPool> pool;
    if (a.threads > 1) pool.emplace(a.threads);
    ThreadPool* pp = pool ? &*pool : nullptr;
    std::optional<AttentionProblem> problem;
    std::optional<AttentionResult> ref;
    nlohmann::json peak = nlohmann::json::object(), step = nlohmann::json::object(),
                   overlap = nlohmann::json::object(), exposed = nlohmann::json::object(),
                   alone = nlohmann::json::object(), compute = nlohmann::json::object(),
                   exposed_comm = nlohmann::json::object(), imbalance = nlohmann::json::object(),
                   tiles = nlohmann::json::object(), pieces = nlohmann::json::object(),
                   ulysses = nlohmann::json::object();
    std::vector<int> ran;
    double max_rel = 0;
    const std::string load_before = bench::load_average();
    for (std::int64_t cp64 : int_list(f->cp_sizes, "--cp-sizes", 1, 4096)) {
      const int cp = static_cast<int>(cp64);
      if (w.size() % cp != 0) continue;
      // Ranks 0..cp-1 run; the rest wait at the barrier below.
      std::unique_ptr<Communicator> g = w.split(w.rank() < cp ? 0 : 1, w.rank());
      if (w.rank() < cp) {
        if (!problem) {
          problem = make_attention_problem(a, 7);
          ref = kernel_attention(*problem, pp);
        }
        const CpResult r = run_cp(*g, a, *problem, *ref, f->reps, pp, 0);
        const std::string key = std::to_string(cp);
        if (cp > 1 && f->piece_tokens > 0) {
          const CpResult q = run_cp(*g, a, *problem, *ref, f->reps, pp, f->piece_tokens);
          pieces[key] = {{"passes", q.passes},
                         {"peak_bytes", q.peak_bytes},
                         {"step_seconds", q.step_seconds},
                         {"exposed_comm_seconds", q.exposed_comm_seconds},
                         {"imbalance_seconds", q.imbalance_seconds},
                         {"max_rel_err", q.rel_err}};
        }
        // Ulysses on the same group beside the ring (where cp can split the heads): its peak,
        // time, error, and both schedules' bytes sent a rank (forward + backward).
        if (cp > 1 && ulysses_refusal(a.q_heads, a.kv_heads, cp).empty()) {
          const CpResult u = run_cp(*g, a, *problem, *ref, f->reps, pp, 0, ContextAttention::ulysses);
          RingAttentionConfig rc;
          rc.dims = a;
          rc.seq_len = a.tokens;
          std::uint64_t ring_sent = 0, ulysses_sent = 0;
          for (int rank = 0; rank < cp; ++rank) {
            const RingAttentionTraffic t = ring_attention_traffic(rc, cp, rank), v = ulysses_attention_traffic(rc, cp, rank);
            ring_sent = std::max(ring_sent, t.forward + t.backward);
            ulysses_sent = std::max(ulysses_sent, v.forward + v.backward);
          }
          ulysses[key] = {{"peak_bytes", u.peak_bytes},
                          {"step_seconds", u.step_seconds},
                          {"max_rel_err", u.rel_err},
                          {"bytes_sent", ulysses_sent},
                          {"ring_bytes_sent", ring_sent}};
        }
        peak[key] = r.peak_bytes;
        step[key] = r.step_seconds;
        exposed[key] = r.exposed_seconds;
        compute[key] = r.compute_seconds;
        if (cp > 1) {
          alone[key] = r.alone_seconds;
          exposed_comm[key] = r.exposed_comm_seconds;
          imbalance[key] = r.imbalance_seconds;
          overlap[key] =
              r.alone_seconds > 0 ? std::clamp(1.0 - r.exposed_comm_seconds / r.alone_seconds, 0.0, 1.0) : 1.0;
        }
        max_rel = std::max(max_rel, r.rel_err);
        // The score tiles the group's kernel calls compute per head, and the causal ring's.
        RingAttentionConfig rc, causal;
        rc.dims = a;
        rc.seq_len = a.tokens;
        causal = rc;
        causal.dims.window = 0;
        std::int64_t n[4] = {0, 0, 0, 0};
        for (int rank = 0; rank < cp; ++rank) {
          const AttentionTiles t = ring_attention_tiles(rc, cp, rank), u = ring_attention_tiles(causal, cp, rank);
          n[0] += t.forward, n[1] += t.backward, n[2] += u.forward, n[3] += u.backward;
        }
        tiles[key] = {{"forward", n[0]}, {"backward", n[1]}, {"causal_forward", n[2]}, {"causal_backward", n[3]}};
      }
      sleepy_barrier(w);
      ran.push_back(cp);
    }
    if (w.rank() == 0) {
      j["ranks"] = w.size();
      j["cp_sizes"] = ran;
      j["ring_seq_len"] = a.tokens;
      j["peak_bytes"] = peak;
      j["step_seconds"] = step;
      j["overlap_fraction"] = overlap;
      j["overlap_fraction_is"] = "per CP size (CP > 1): 1 - exposed_comm / communication alone";
      j["exposed_seconds"] = exposed;
      j["exposed_comm_seconds"] = exposed_comm;
      j["imbalance_seconds"] = imbalance;
      j["communication_alone_seconds"] = alone;
      j["compute_seconds"] = compute;
      j["ring_tiles"] = tiles;
      j["ring_tiles_are"] = "per CP size: the [Bq x Bk] score tiles per head the group's kernel calls compute (with "
                            "--window, beside the causal ring's)";
      j["max_rel_err"] = max_rel;
      j["ulysses"] = ulysses;
      j["ulysses_is"] = "per CP size > 1 where cp can split the heads: Ulysses attention (the heads split over the group "
                        "by all-to-all) on the same group after the ring: its attention peak_bytes, step_seconds and "
                        "max_rel_err as the ring's, and the most bytes a rank sends per forward + backward under "
                        "each (bytes_sent, ring_bytes_sent)";
      if (f->piece_tokens > 0) {
        j["piece_tokens"] = f->piece_tokens;
        j["pieces"] = pieces;
        j["pieces_are"] = "per CP size > 1: the same ring carrying pieces of piece_tokens (passes round the ring), "
                          "run after the whole-shard ring on the same group";
      }
      j["ring_load_average_before"] = load_before;
      j["ring_load_average_after"] = bench::load_average();
      std::printf("%s\n", j.dump(2).c_str());
    }
    return 0;
  };
  return c;
}

const bool registered = register_command("bench", "attention", &add_bench_attention);

}  // namespace

}  // namespace peakbound::cli
