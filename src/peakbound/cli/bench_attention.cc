// `peakbound bench attention`: the CPU flash attention kernel (kernels/cpu/attention.h)
// alone on one sequence, forward and backward timed separately (best of --reps after a
// warm-up), as GFLOP/s of the causal block products: forward 2 P Hq (D + Dv), backward
// 2 P Hq (3 D + 2 Dv) (S recomputed, dP, dV, dK, dQ), P = T (T + 1) / 2 visible pairs.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "peakbound/bench/harness.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/core/error.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/kernels/cpu/attention.h"

namespace peakbound::cli {

namespace {

struct BenchAttentionFlags {
  std::int64_t tokens = 2048, heads = 8, kv_heads = 2, dim = 64, block_q = 64, block_k = 64;
  int threads = 1, reps = 3;
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return f ? a + " " + b + " " + c : "unknown";
}

Command add_bench_attention(CLI::App& parent) {
  auto f = std::make_shared<BenchAttentionFlags>();
  Command c;
  c.app = parent.add_subcommand("attention", "The CPU flash attention kernel: forward and backward GFLOP/s");
  int_flag(c.app, "--tokens", f->tokens, "Sequence length T", 1, 32768);
  int_flag(c.app, "--heads", f->heads, "Query heads Hq", 1, 256);
  int_flag(c.app, "--kv-heads", f->kv_heads, "Key/value heads Hkv (divides --heads)", 1, 256);
  int_flag(c.app, "--dim", f->dim, "Head dimension D = Dv", 1, 1024);
  int_flag(c.app, "--block-q", f->block_q, "Query rows per tile", 1, 4096);
  int_flag(c.app, "--block-k", f->block_k, "Keys per tile", 1, 4096);
  int_flag(c.app, "--threads", f->threads, "Threads (a pool of this size; 1: the caller only)", 1, 256);
  int_flag(c.app, "--reps", f->reps, "Timed repetitions after one warm-up (best is kept)", 1, 100);
  c.validate = [f] {
    if (f->heads % f->kv_heads != 0)
      throw InvalidArgument("--kv-heads " + std::to_string(f->kv_heads) + " does not divide --heads " +
                            std::to_string(f->heads));
    // q, dq, out, dout [T, Hq, D] and k, v, dk, dv [T, Hkv, D], held in host vectors.
    const double floats = 4.0 * static_cast<double>(f->tokens) * static_cast<double>(f->heads + f->kv_heads) *
                          static_cast<double>(f->dim);
    if (floats > 1073741824.0)
      throw InvalidArgument("--tokens x (--heads + --kv-heads) x --dim needs " + std::to_string(floats * 4 / 1073741824.0) +
                            " GiB of tensors; this benchmark keeps them under 4 GiB");
  };
  c.run = [f] {
    cpu::AttentionDims a;
    a.tokens = f->tokens;
    a.q_heads = f->heads;
    a.kv_heads = f->kv_heads;
    a.qk_dim = a.v_dim = f->dim;
    a.block_q = f->block_q;
    a.block_k = f->block_k;
    a.threads = f->threads;
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
    std::vector<float> out(dout.size()), lse(T * a.q_heads), dq(q.size()), dk(k.size()), dv(v.size()),
        ws(static_cast<std::size_t>(cpu::attention_workspace_floats(a)));
    std::optional<ThreadPool> pool;
    if (a.threads > 1) pool.emplace(a.threads);
    ThreadPool* p = pool ? &*pool : nullptr;
    const std::string load_before = load_average();
    const double fwd = bench::best_seconds(
        [&] { cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), a, ws.data(), p); }, 1,
        f->reps);
    const double bwd = bench::best_seconds(
        [&] {
          cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                  out.data(), lse.data(), a, ws.data(), p);
        },
        1, f->reps);
    const double pairs = static_cast<double>(a.tokens) * static_cast<double>(a.tokens + 1) / 2.0;
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
                        {"workspace_floats", cpu::attention_workspace_floats(a)},
                        {"forward_seconds", fwd},
                        {"backward_seconds", bwd},
                        {"forward_gflops", fwd_flops / fwd * 1e-9},
                        {"backward_gflops", bwd_flops / bwd * 1e-9},
                        {"load_average_before", load_before},
                        {"load_average_after", load_average()},
                        {"machine", bench::machine_info()}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  };
  return c;
}

const bool registered = register_command("bench", "attention", &add_bench_attention);

}  // namespace

}  // namespace peakbound::cli
