// `peakbound verify attention` and `bench attention`'s ring part through the binary: one
// rank passes (CP 1), under mpirun at 2 ranks both CP sizes run and the report is one
// JSON object from rank 0; bad lists are one line, printed once, without an abort.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;
using testing::run_cli;
using testing::run_mpi;

TEST(AttentionCli, VerifyPassesAsOneRank) {
  CliRun r = run_cli("verify attention --lengths 9,37 --head-ratios 1,4 --windows 0,3");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verify attention: pass"), std::string::npos) << r.out;
  testing::expect_one_line_error(run_cli("verify attention --head-ratios 3"), "--head-ratios");
  testing::expect_one_line_error(run_cli("verify attention --lengths 5,,7"), "--lengths");
}

TEST(AttentionCli, BenchRingPartAsOneRank) {
  CliRun r = run_cli("bench attention --tokens 64 --heads 4 --kv-heads 2 --dim 8 --reps 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("forward_gflops"));  // the kernel part's keys stay
  EXPECT_EQ(j["cp_sizes"], nlohmann::json::array({1}));
  EXPECT_GT(j["peak_bytes"]["1"].get<double>(), 0.0);
  EXPECT_LT(j["max_rel_err"].get<double>(), 1e-5);
}

// --precision bf16: the kernel part times the bf16 kernel and says on which GEMM path; the
// workspace is the bf16 kernel's (larger: the rounded P and dS tiles); a bad name is refused.
TEST(AttentionCli, BenchKernelPartInBf16) {
  CliRun f = run_cli("bench attention --tokens 64 --heads 4 --kv-heads 2 --dim 8 --reps 1 --cp-sizes 1 --json");
  CliRun r = run_cli(
      "bench attention --tokens 64 --heads 4 --kv-heads 2 --dim 8 --reps 1 --cp-sizes 1 --precision bf16 --json");
  ASSERT_EQ(f.code, 0) << f.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json jf = nlohmann::json::parse(f.out), j = nlohmann::json::parse(r.out);
  EXPECT_EQ(jf["precision"], "f32");
  EXPECT_EQ(jf["bf16_gemm_path"], "none");
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_NE(j["bf16_gemm_path"], "none");
  EXPECT_GT(j["workspace_floats"].get<std::int64_t>(), jf["workspace_floats"].get<std::int64_t>());
  EXPECT_GT(j["forward_gflops"].get<double>(), 0.0);
  EXPECT_GT(j["backward_gflops"].get<double>(), 0.0);
  testing::expect_one_line_error(run_cli("bench attention --precision fp8"), "--precision");
}

// --window: the kernel part counts the tiles it computes against the causal kernel's and
// times both; the ring runs the window too, exact against the whole-sequence kernel.
TEST(AttentionCli, BenchWindowCountsTheSkippedTiles) {
  CliRun r = run_cli("bench attention --seq-len 256 --heads 2 --kv-heads 1 --dim 8 --block-q 16 --block-k 16 "
                     "--window 16 --reps 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["window"], 16);
  EXPECT_EQ(j["forward_tiles"], 31);  // the diagonal 16 and the 15 just below it
  EXPECT_EQ(j["backward_tiles"], 31);
  EXPECT_EQ(j["causal_forward_tiles"], 16 * 17 / 2);
  EXPECT_NEAR(j["window_skipped_tile_fraction"].get<double>(), 1.0 - 31.0 / 136.0, 1e-12);
  EXPECT_TRUE(j.contains("causal_forward_seconds"));
  EXPECT_EQ(j["ring_tiles"]["1"]["forward"], 31);  // the ring at CP 1 is the kernel
  EXPECT_EQ(j["ring_tiles"]["1"]["causal_backward"], 136);
  EXPECT_LT(j["max_rel_err"].get<double>(), 1e-5);
  testing::expect_one_line_error(run_cli("bench attention --window -1"), "--window");
}

TEST(AttentionCli, UnderMpiEveryCpRunsAndRank0Reports) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  CliRun v = run_mpi("verify attention --lengths 13 --head-ratios 2 --windows 0,4 --json", 2);
  ASSERT_EQ(v.code, 0) << v.err;
  ASSERT_TRUE(nlohmann::json::accept(v.out)) << v.out;
  const nlohmann::json jv = nlohmann::json::parse(v.out);
  EXPECT_EQ(jv["cp_sizes"], nlohmann::json::array({1, 2}));
  EXPECT_TRUE(jv["pass"].get<bool>());
  // --piece-tokens: the ring in pieces (S 37 at CP 2: shards of 19 and 18 tokens in
  // ceil(19 / 4) = 5 passes), still within 1e-5 of both references.
  // With --query-pieces 3 the queries go in three calls per direction as well (the
  // layer's forward and backward past its piece).
  CliRun vp = run_mpi(
      "verify attention --lengths 37 --head-ratios 2 --windows 0 --piece-tokens 4 --query-pieces 3 --json", 2);
  ASSERT_EQ(vp.code, 0) << vp.err;
  const nlohmann::json jvp = nlohmann::json::parse(vp.out);
  EXPECT_TRUE(jvp["pass"].get<bool>());
  bool pieced = false;
  for (const auto& k : jvp["cases"])
    if (k["cp"] == 2 && k["seq_len"] == 37) pieced = k["passes"] == 5 && k["query_pieces"] == 3;
  EXPECT_TRUE(pieced) << jvp.dump();
  CliRun b = run_mpi("bench attention --seq-len 64 --heads 4 --kv-heads 2 --dim 8 --reps 1 --json", 2);
  ASSERT_EQ(b.code, 0) << b.err;
  ASSERT_TRUE(nlohmann::json::accept(b.out)) << b.out;
  const nlohmann::json jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(jb["cp_sizes"], nlohmann::json::array({1, 2}));  // 4 does not divide 2 ranks
  // The ring holds half the sequence's tensors per rank, plus its buffers.
  EXPECT_LT(jb["peak_bytes"]["2"].get<double>(), jb["peak_bytes"]["1"].get<double>());
  EXPECT_TRUE(jb["overlap_fraction"].contains("2"));
  EXPECT_LT(jb["max_rel_err"].get<double>(), 1e-5);
  EXPECT_FALSE(jb.contains("pieces"));
  // Ulysses beside the ring at CP 2 (2 KV heads split over 2 ranks): exact, its peak the
  // tensors plus its own buffers, the bytes each sends (the traffic functions) both set.
  ASSERT_TRUE(jb["ulysses"].contains("2")) << jb["ulysses"];
  EXPECT_LT(jb["ulysses"]["2"]["max_rel_err"].get<double>(), 1e-5);
  EXPECT_GT(jb["ulysses"]["2"]["peak_bytes"].get<double>(), 0.0);
  EXPECT_GT(jb["ulysses"]["2"]["bytes_sent"].get<double>(), 0.0);
  EXPECT_GT(jb["ulysses"]["2"]["ring_bytes_sent"].get<double>(), 0.0);
  EXPECT_FALSE(jb["ulysses"].contains("1"));
  // --piece-tokens: CP 2 again carrying pieces (shards of 32 tokens in pieces of 10: 4
  // passes), exact, its peak below the whole-shard ring's.
  CliRun pc = run_mpi("bench attention --seq-len 64 --heads 4 --kv-heads 2 --dim 8 --reps 1 --cp-sizes 2 "
                      "--piece-tokens 10 --json", 2);
  ASSERT_EQ(pc.code, 0) << pc.err;
  const nlohmann::json jp = nlohmann::json::parse(pc.out);
  EXPECT_EQ(jp["piece_tokens"], 10);
  EXPECT_EQ(jp["pieces"]["2"]["passes"], 4);
  EXPECT_LT(jp["pieces"]["2"]["peak_bytes"].get<double>(), jp["peak_bytes"]["2"].get<double>());
  EXPECT_LT(jp["pieces"]["2"]["max_rel_err"].get<double>(), 1e-5);
  // --tokens is the old name of --seq-len; the error names the one rule's setting.
  CliRun e = run_mpi("bench attention --tokens 3 --cp-sizes 2", 2);
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.err.find("--seq-len must be at least 4, got 3"), std::string::npos) << e.err;
  EXPECT_EQ(e.err.find("MPI_ABORT"), std::string::npos) << e.err;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
