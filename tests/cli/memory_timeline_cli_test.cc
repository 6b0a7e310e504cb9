// `peakbound train --memory-timeline` and `peakbound plot-memory` through the binary:
// a short run writes a timeline whose steps, phases and peak agree with the run's
// measured peak (one file per rank under mpirun); plot-memory draws a step as an SVG
// naming the binding component at the peak, two side by side with --compare, and a bad
// file or step is a one-line error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "peakbound/core/arena.h"
#include "peakbound/io/memory_timeline_file.h"
#include "tests/cli/run_cli.h"

namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using peakbound::testing::last_json_line;
using peakbound::testing::CliRun;
using peakbound::testing::expect_one_line_error;
using peakbound::testing::run_cli;
using peakbound::testing::slurp;

namespace pb = peakbound;

constexpr std::uint64_t MiB = 1024 * 1024;

// A small timeline: two steps; in step 2 the peak is params 4 MiB + vocab 6 MiB (vocab binds, 60%).
std::string write_small_timeline(const std::string& name, std::uint64_t vocab_bytes) {
  pb::Arena a("test", 16 * MiB, nullptr);
  pb::Buffer p = a.allocate(pb::Component::params, 4 * MiB);
  a.start_timeline();
  for (std::int64_t step = 1; step <= 2; ++step) {
    a.begin_step(step);
    for (int l = 0; l < 3; ++l) {
      pb::mark_phase(a, "forward layer", l);
      pb::Buffer x = a.allocate(pb::Component::layer, 512 * 1024);
    }
    pb::mark_phase(a, "loss");
    { pb::Buffer v = a.allocate(pb::Component::vocab, step == 2 ? vocab_bytes : MiB); }
    for (int l = 2; l >= 0; --l) {
      pb::mark_phase(a, "backward layer", l);
      pb::Buffer g = a.allocate(pb::Component::grads, MiB);
    }
    pb::mark_phase(a, "optimizer");
    { pb::Buffer o = a.allocate(pb::Component::optimizer, 2 * MiB); }
    a.end_step();
  }
  pb::MemoryTimeline t = a.take_timeline();
  t.title = "small test";
  const std::string path = ::testing::TempDir() + "/" + name;
  pb::write_memory_timeline(path, t);
  return path;
}

TEST(CliPlotMemory, DrawsTheStepAndNamesTheBindingComponent) {
  const std::string in = write_small_timeline("plot_small.json", 6 * MiB);
  const std::string svg = ::testing::TempDir() + "/plot_small.svg";
  std::remove(svg.c_str());
  CliRun r = run_cli("plot-memory " + in + " -o " + svg);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step 2, peak 10.00 MiB: vocab 60%"), std::string::npos) << r.out;
  const std::string s = slurp(svg);
  ASSERT_EQ(s.rfind("<svg", 0), 0u) << s.substr(0, 200);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_NE(s.find("peak 10.00 MiB: vocab 60%"), std::string::npos);
  EXPECT_NE(s.find("budget 16.00 MiB"), std::string::npos);
  EXPECT_NE(s.find("<title>optimizer</title>"), std::string::npos);  // a phase band
  EXPECT_NE(s.find("small test"), std::string::npos);

  // Step 1: the peak is params + optimizer (2 MiB) = 6 MiB, params binding.
  r = run_cli("plot-memory " + in + " -o " + svg + " --step 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 1, peak 6.00 MiB: params 67%"), std::string::npos) << r.out;
}

TEST(CliPlotMemory, ComparesTwoTimelinesSideBySide) {
  const std::string a = write_small_timeline("plot_a.json", 6 * MiB);
  const std::string b = write_small_timeline("plot_b.json", MiB);
  const std::string svg = ::testing::TempDir() + "/plot_ab.svg";
  CliRun r = run_cli("plot-memory --compare " + a + " " + b + " -o " + svg);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string s = slurp(svg);
  EXPECT_NE(s.find("peak 10.00 MiB: vocab 60%"), std::string::npos);
  EXPECT_NE(s.find("peak 6.00 MiB: params 67%"), std::string::npos);
  EXPECT_NE(s.find("width=\"1640.0\""), std::string::npos);  // two panels
}

TEST(CliPlotMemory, BadInputIsAOneLineError) {
  const std::string bad = ::testing::TempDir() + "/plot_bad.json";
  std::ofstream(bad) << "{\"rank\": 0";
  expect_one_line_error(run_cli("plot-memory " + bad), "not valid JSON");
  std::ofstream(bad) << "{\"rank\": 0, \"world\": 1}";
  expect_one_line_error(run_cli("plot-memory " + bad), "budget_bytes");
  expect_one_line_error(run_cli("plot-memory " + ::testing::TempDir() + "/no_such_timeline.json"), "cannot read");
  const std::string in = write_small_timeline("plot_steps.json", MiB);
  expect_one_line_error(run_cli("plot-memory " + in + " --step 9"), "--step 9");
  expect_one_line_error(run_cli("plot-memory"), "--compare");
}

// Replays a timeline file: the largest total live bytes over all its events.
std::uint64_t replayed_peak(const pb::MemoryTimeline& t) {
  pb::ComponentBytes live = t.initial;
  std::uint64_t peak = 0;
  auto total = [&] {
    std::uint64_t s = 0;
    for (std::uint64_t v : live) s += v;
    return s;
  };
  peak = total();
  for (const pb::MemoryEvent& e : t.events) {
    live[e.component] = static_cast<std::uint64_t>(static_cast<std::int64_t>(live[e.component]) + e.delta);
    peak = std::max(peak, total());
  }
  return peak;
}

TEST(CliTrainMemoryTimeline, ARunWritesStepsPhasesAndItsPeak) {
  const std::string file = ::testing::TempDir() + "/train_timeline.json";
  std::remove(file.c_str());
  CliRun r = run_cli("train --steps 2 --seq-len 32 --eval-every 0 --json --memory-timeline " + file, 300);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const pb::MemoryTimeline t = pb::read_memory_timeline(file);
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[0].step, 1);
  EXPECT_EQ(t.steps[1].step, 2);
  EXPECT_FALSE(t.truncated);
  for (const char* p : {"embedding", "forward layer 0", "forward layer 1", "loss", "backward layer 0", "reduce", "optimizer"})
    EXPECT_NE(std::find(t.phases.begin(), t.phases.end(), p), t.phases.end()) << p;
  EXPECT_NE(t.title.find("schedules all"), std::string::npos) << t.title;
  EXPECT_EQ(nlohmann::json::parse(t.meta)["seq_len"], 32);
  // The step's peak is the run's measured peak (the model's setup stays below it).
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(replayed_peak(t), j["peaks"]["total"]["measured_bytes"].get<std::uint64_t>());
  const std::string svg = ::testing::TempDir() + "/train_timeline.svg";
  r = run_cli("plot-memory " + file + " -o " + svg);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(slurp(svg).find("peak "), std::string::npos);
}

TEST(CliTrainMemoryTimeline, OneFilePerRankUnderMpirun) {
  if (!peakbound::testing::have_mpirun()) GTEST_SKIP() << "no mpirun";
  const std::string file = ::testing::TempDir() + "/train_timeline_mpi.json";
  for (int k = 0; k < 2; ++k) std::remove(pb::memory_timeline_path(file, k, 2).c_str());
  CliRun r = peakbound::testing::run_mpi("train --steps 1 --seq-len 32 --eval-every 0 --memory-timeline " + file, 2, 300);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (int k = 0; k < 2; ++k) {
    const pb::MemoryTimeline t = pb::read_memory_timeline(pb::memory_timeline_path(file, k, 2));
    EXPECT_EQ(t.rank, k);
    EXPECT_EQ(t.world, 2);
    EXPECT_EQ(t.steps.size(), 1u);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
