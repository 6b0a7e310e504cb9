// `peakbound verify attention`: ring attention (schedules/ring_attention.h) forward and
// backward against the single-rank kernel on the whole sequence and a naive double
// reference (verify/attention_reference.h), under mpirun with W ranks, for every CP
// dividing W (groups of CP consecutive ranks, each group one sequence), over odd
// lengths (the given ones and 2 CP + 1), GQA head ratios and windows; with --piece-tokens N
// the ring carries K/V and dK/dV in pieces of N tokens (RingAttentionConfig::piece_tokens,
// what the attention layer does past kRingPieceTokens); with --query-pieces N the queries
// go in N calls (RingAttentionConfig::query_pieces, at most the shortest zigzag chunk's
// tokens; cp > 1 only), what the layer's forward and backward do. One line per case (the worst over
// the groups), the worst relative error, --json; exit 1 on any error at or above 1e-5
// relative.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peakbound/cli/attention_flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/footprint.h"
#include "peakbound/comm/device_communicator.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/schedules/ring_attention.h"
#include "peakbound/verify/attention_reference.h"

namespace peakbound::cli {

namespace {

constexpr double kTolerance = 1e-5;

struct VerifyAttentionFlags {
  std::string device = "cpu";
  std::string lengths = "37,130", ratios = "1,2,4", windows = "0,5";
  std::int64_t heads = 4, dim = 16, v_dim = 8, block_q = 7, block_k = 5, piece_tokens = 0, query_pieces = 1;
  std::uint64_t seed = 1;
  bool json = false;

  std::vector<std::int64_t> length_list() const { return int_list(lengths, "--lengths", 1, 1 << 16); }
  std::vector<std::int64_t> window_list() const { return int_list(windows, "--windows", 0, 1 << 16); }
  std::vector<std::int64_t> ratio_list() const {
    std::vector<std::int64_t> r = int_list(ratios, "--head-ratios", 1, 256);
    for (std::int64_t x : r)
      if (heads % x != 0)
        throw InvalidArgument("--head-ratios: " + std::to_string(x) + " does not divide --heads " + std::to_string(heads));
    return r;
  }
};

Command add_verify_attention(CLI::App& parent) {
  auto f = std::make_shared<VerifyAttentionFlags>();
  Command c;
  c.collective = true;  // every rank of every CP group takes part
  c.app = parent.add_subcommand("attention",
                                "Ring attention (context parallel, zigzag) vs the single-rank kernel and a naive double "
                                "reference, for every CP dividing the launched ranks (run under mpirun for CP > 1)");
  text_flag(c.app, "--lengths", f->lengths, "Sequence lengths S, comma-separated (2 CP + 1 is added per CP)");
  int_flag(c.app, "--heads", f->heads, "Query heads Hq", 1, 256);
  text_flag(c.app, "--head-ratios", f->ratios, "GQA ratios Hq / Hkv, comma-separated (each divides --heads)");
  int_flag(c.app, "--dim", f->dim, "Query/key head dimension D", 1, 1024);
  int_flag(c.app, "--v-dim", f->v_dim, "Value head dimension Dv", 1, 1024);
  text_flag(c.app, "--windows", f->windows, "Sliding windows in keys, comma-separated (0: full causal)");
  int_flag(c.app, "--block-q", f->block_q, "Query rows per kernel tile", 1, 4096);
  int_flag(c.app, "--block-k", f->block_k, "Keys per kernel tile", 1, 4096);
  int_flag(c.app, "--piece-tokens", f->piece_tokens,
           "The ring carries K/V and dK/dV in pieces of this many tokens (0: whole shards)", 0, 1 << 30);
  int_flag(c.app, "--query-pieces", f->query_pieces,
           "The queries in this many calls, dK/dV summed over them (at most the shortest chunk; cp > 1)", 1, 1 << 20);
  seed_flag(c.app, "--seed", f->seed, "Seed of the random problem");
  device_flag(c.app, f->device);
  c.app->add_flag("--json", f->json, "Print one JSON object");
  c.validate = [f] {
    f->length_list();
    f->window_list();
    f->ratio_list();
  };
  c.run = [f] {
    auto world = world_communicator();
    Communicator& w = *world;
    const int W = w.size();
    nlohmann::json cases = nlohmann::json::array();
    double worst_naive = 0, worst_kernel = 0;
    bool ok = true;
    std::vector<int> cps;
    for (int cp = 1; cp <= W; ++cp)
      if (W % cp == 0) cps.push_back(cp);
    for (int cp : cps) {
      std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
      std::vector<std::int64_t> lengths = f->length_list();
      lengths.push_back(2 * cp + 1);
      std::sort(lengths.begin(), lengths.end());
      lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
      for (std::int64_t S : lengths) {
        if (S < 2 * cp) continue;  // every zigzag chunk must hold a token
        for (std::int64_t ratio : f->ratio_list())
          for (std::int64_t window : f->window_list()) {
            AttentionDims a;
            a.tokens = S;
            a.q_heads = f->heads;
            a.kv_heads = f->heads / ratio;
            a.qk_dim = f->dim;
            a.v_dim = f->v_dim;
            a.window = window;
            a.block_q = f->block_q;
            a.block_k = f->block_k;
            const AttentionProblem p = make_attention_problem(a, f->seed + static_cast<std::uint64_t>(S));
            const AttentionResult naive = naive_attention(p), kernel = kernel_attention(p);
            RingAttentionConfig cfg;
            cfg.dims = a;
            cfg.seq_len = S;
            cfg.piece_tokens = f->piece_tokens;
            const int query_pieces =
                cp > 1 ? static_cast<int>(std::min(f->query_pieces, zigzag_shortest_chunk(S, cp))) : 1;
            std::unique_ptr<Device> dev = make_device(f->device, ring_attention_device_budget(cfg, cp));
            std::unique_ptr<Communicator> gpu_group = device_group_for(*dev, *g);
            RingAttentionCheck chk = verify_ring_attention(*dev, gpu_group ? *gpu_group : *g, p, naive, kernel,
                                                           Component::layer, nullptr, f->piece_tokens,
                                                           query_pieces);
            const int passes = ring_attention_pieces(cfg, cp);
            // The worst over the groups (each ran the same sequence).
            w.all_reduce(chk.naive, 5, DType::f64, ReduceOp::max);
            w.all_reduce(chk.kernel, 5, DType::f64, ReduceOp::max);
            const double en = chk.worst_naive(), ek = chk.worst_kernel();
            const bool pass = en < kTolerance && ek < kTolerance;
            ok = ok && pass;
            worst_naive = std::max(worst_naive, en);
            worst_kernel = std::max(worst_kernel, ek);
            nlohmann::json jn, jk;
            for (int i = 0; i < 5; ++i) {
              jn[kAttentionFields[i]] = chk.naive[i];
              jk[kAttentionFields[i]] = chk.kernel[i];
            }
            cases.push_back({{"cp", cp}, {"seq_len", S}, {"q_heads", a.q_heads}, {"kv_heads", a.kv_heads},
                             {"qk_dim", a.qk_dim}, {"v_dim", a.v_dim}, {"window", window}, {"passes", passes},
                             {"query_pieces", query_pieces},
                             {"rel_err_naive", jn}, {"rel_err_kernel", jk}, {"pass", pass}});
            if (w.rank() == 0 && !f->json)
              std::printf("CP %d  S %5lld  Hq %3lld  Hkv %3lld  D %4lld  Dv %4lld  window %4lld  vs naive %.2e  vs kernel %.2e  %s\n",
                          cp, static_cast<long long>(S), static_cast<long long>(a.q_heads),
                          static_cast<long long>(a.kv_heads), static_cast<long long>(a.qk_dim),
                          static_cast<long long>(a.v_dim), static_cast<long long>(window), en, ek, pass ? "ok" : "MISMATCH");
          }
      }
    }
    if (w.rank() == 0) {
      if (f->json) {
        nlohmann::json j = {{"ranks", W},           {"cp_sizes", cps},
                            {"tolerance", kTolerance}, {"cases", cases},
                            {"worst_rel_err_naive", worst_naive}, {"worst_rel_err_kernel", worst_kernel},
                            {"pass", ok}};
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        std::printf("%s (%zu cases, W = %d; worst relative error vs naive %.2e, vs kernel %.2e; tolerance %.0e)\n",
                    ok ? "verify attention: pass" : "verify attention: FAIL", cases.size(), W, worst_naive, worst_kernel,
                    kTolerance);
      }
    }
    return ok ? 0 : 1;
  };
  return c;
}

const bool registered = register_command("verify", "attention", &add_verify_attention);

}  // namespace

}  // namespace peakbound::cli
