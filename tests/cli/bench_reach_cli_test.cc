// `peakbound bench reach` end to end on 2 ranks (its own mpirun jobs): the JSON's fields, every
// trial consistent with the reach it reports (what fitted is at most the reach, what was
// refused is beyond it), all four reaching at least the baseline's context, the refusal named,
// and the plan beside the measured peak (and, with --keep-attention, the scheduled job keeping
// the attention: the same losses; with --peer-json, the scheduled job at the peer's reach,
// once as the search runs it and once training the peer's sequences a step); bad flags and a
// launch under mpirun are one-line errors.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::CliRun;

TEST(CliBenchReach, TwoRanksBaselineAndAllFourAsJson) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "about 20 training jobs: too slow under the sanitizers (the release suite runs it)";
#endif
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  // 240 MiB a rank: the baseline (planned reach 870 tokens) is refused inside the range.
  // A peer (bench/peer_fsdp2.py's fields) that reached 256 tokens on 2 ranks, one sequence each.
  const std::string peer = ::testing::TempDir() + "bench_reach_peer.json";
  std::ofstream(peer) << R"({"reach_tokens": 256, "tokens_per_second_at_reach": 100.0, "ranks": 2, "precision": "f32"})"
                      << "\n";
  const CliRun r = testing::run_cli(
      "bench reach --precision f32 --ranks 2 --cp 2 --budget 240MiB --configs none,all --start 256 --multiple 128 "
      "--max-context 1024 --trial-steps 2 --resolution 0.25 --keep-attention --json --peer-json " + peer,
      600);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const std::int64_t base = j.at("reach_tokens").at("baseline"), sched = j.at("reach_tokens").at("scheduled");
  EXPECT_GT(base, 0);
  EXPECT_GE(sched, base);
  EXPECT_DOUBLE_EQ(j.at("reach_ratio").get<double>(), double(sched) / double(base));
  for (const char* name : {"baseline", "scheduled"}) {
    const nlohmann::json& c = j.at("configs").at(name);
    EXPECT_EQ(c.at("reach_tokens").get<std::int64_t>(), j["reach_tokens"][name].get<std::int64_t>());
    for (const nlohmann::json& t : c.at("trials")) {
      const std::int64_t ctx = t.at("context");
      EXPECT_EQ(ctx % 128, 0);
      if (t.at("fits").get<bool>()) {
        EXPECT_LE(ctx, c["reach_tokens"].get<std::int64_t>()) << name;
        EXPECT_LE(t.at("peak_bytes").get<std::int64_t>(), std::int64_t{240} << 20) << name;
      } else {
        EXPECT_GT(ctx, c["reach_tokens"].get<std::int64_t>()) << name;
        EXPECT_NE(t.at("refusal").get<std::string>().find("budget in use"), std::string::npos);
      }
    }
    EXPECT_TRUE(c.contains("binding")) << name;
    EXPECT_GT(c.at("tokens_per_second").get<double>(), 0) << name;
  }
  // The baseline was refused within the range, naming the component.
  ASSERT_GT(j["configs"]["baseline"]["first_refused_tokens"].get<std::int64_t>(), 0);
  EXPECT_FALSE(j["configs"]["baseline"].at("refused_by").get<std::string>().empty());
  // Side by side at the baseline's reach; the plan beside the measured at the scheduled reach.
  EXPECT_EQ(j.at("throughput_at_baseline_reach").at("context").get<std::int64_t>(), base);
  EXPECT_GT(j.at("throughput_ratio_at_baseline_reach").get<double>(), 0);
  // The same model on the same data under both: the losses agree to f32 rounding (in f32; the
  // first before any update, the last after the trial's updates).
  const nlohmann::json& losses = j["throughput_at_baseline_reach"].at("losses");
  ASSERT_FALSE(losses.empty());
  for (const nlohmann::json& l : losses) {
    EXPECT_GT(l.at("baseline_first_loss").get<double>(), 0) << l.dump();
    EXPECT_GT(l.at("baseline_last_loss").get<double>(), 0) << l.dump();
    EXPECT_LT(l.at("first_loss_relative_difference").get<double>(), 1e-6) << l.dump();
    EXPECT_LT(l.at("last_loss_relative_difference").get<double>(), 1e-6) << l.dump();
  }
  // --keep-attention: the scheduled job again, keeping the attention, fits where the
  // scheduled one did (it reaches further than the baseline) with the same losses bitwise.
  EXPECT_EQ(j["throughput_at_baseline_reach"].at("scheduled_keep_attention_tokens_per_second").size(), 2u);
  EXPECT_TRUE(j["throughput_at_baseline_reach"].at("keep_attention_same_losses").get<bool>());
  EXPECT_GT(j.at("throughput_ratio_at_baseline_reach_keep_attention").get<double>(), 0);
  const nlohmann::json& total = j.at("plan_vs_measured").at("total");
  EXPECT_EQ(total.at("measured_bytes"), j["configs"]["scheduled"].at("peak_bytes"));
  EXPECT_GE(total.at("planned_bytes").get<std::int64_t>(), total.at("measured_bytes").get<std::int64_t>());
  // The peer: the reach ratio, the scheduled job at 256 tokens as the search runs it (one
  // sequence over the cp group of 2), and with the peer's 2 sequences a step (--batch 2).
  EXPECT_DOUBLE_EQ(j.at("reach_ratio_vs_torch_fsdp2").get<double>(), double(sched) / 256.0);
  const nlohmann::json& one = j.at("throughput_vs_torch_fsdp2");
  EXPECT_EQ(one.at("context").get<double>(), 256.0);
  EXPECT_DOUBLE_EQ(j.at("throughput_ratio_vs_torch_fsdp2").get<double>(),
                   one.at("scheduled_tokens_per_second").get<double>() / 100.0);
  const nlohmann::json& same = j.at("throughput_vs_torch_fsdp2_same_batch");
  EXPECT_EQ(same.at("batch").get<std::int64_t>(), 2);
  EXPECT_EQ(same.at("sequences_per_step").get<std::int64_t>(), 2);
  EXPECT_GT(same.at("scheduled_tokens_per_second").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j.at("throughput_ratio_vs_torch_fsdp2_same_batch").get<double>(),
                   same.at("scheduled_tokens_per_second").get<double>() / 100.0);
}

TEST(CliBenchReach, BadFlagsAreOneLineErrors) {
  testing::expect_one_line_error(testing::run_cli("bench reach --configs none,bogus"), "bogus");
  testing::expect_one_line_error(testing::run_cli("bench reach --configs dtp+nope"), "nope");
  testing::expect_one_line_error(testing::run_cli("bench reach --ranks 4 --cp 3"), "--cp 3");
  testing::expect_one_line_error(testing::run_cli("bench reach --cp 4 --multiple 6"), "--multiple");
  testing::expect_one_line_error(testing::run_cli("bench reach --budget lots"), "--budget");
  testing::expect_one_line_error(testing::run_cli("bench reach --peer-json /nonexistent/peer.json"), "peer.json");
}

TEST(CliBenchReach, RefusesToRunUnderMpirun) {
  if (!testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const CliRun r = testing::run_mpi("bench reach", 2);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("without mpirun"), std::string::npos) << r.err;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
