// The Arena's memory timeline: off by default (nothing recorded), every allocate and
// release recorded when on with the ledger's rounded bytes, so replaying the events from
// the initial live bytes gives the ledger's live bytes per component after every one;
// phases (sequential marks and the RAII MemoryPhase) and step marks; the event cap; the
// JSON round trip, its validation and the per-rank file naming.
#include "peakbound/io/memory_timeline_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

TEST(MemoryTimeline, OffByDefaultRecordsNothing) {
  Arena a("test", 16 * MiB, nullptr);
  EXPECT_FALSE(a.recording());
  {
    MemoryPhase p(a, "forward layer", 0);
    mark_phase(a, "loss");
    a.begin_step(1);
    Buffer b = a.allocate(Component::params, 1000);
    a.end_step();
  }
  const MemoryTimeline t = a.take_timeline();
  EXPECT_TRUE(t.events.empty());
  EXPECT_TRUE(t.steps.empty());
  EXPECT_TRUE(t.phase_marks.empty());
  EXPECT_EQ(t.phases.size(), 1u);  // only "(none)"
}

TEST(MemoryTimeline, ReplayingTheEventsGivesTheLedgersLiveBytesAtEveryPoint) {
  Arena a("test", 64 * MiB, nullptr);
  Buffer before = a.allocate(Component::params, 3 * MiB + 7);  // live before recording: the initial bytes
  a.start_timeline(2, 4);
  std::mt19937 rng(7);
  std::vector<Buffer> live;
  std::vector<ComponentBytes> expected;  // the ledger after each event
  auto snapshot = [&] {
    ComponentBytes b{};
    for (std::size_t c = 0; c < kNumComponents; ++c) b[c] = a.live(kAllComponents[c]);
    expected.push_back(b);
  };
  for (int i = 0; i < 400; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const Component c = kAllComponents[rng() % kNumComponents];
      try {
        live.push_back(a.allocate(c, 1 + rng() % (rng() % 2 ? 4096 : 512 * 1024)));  // small and large
      } catch (const OutOfBudget&) {
        continue;  // refused: nothing recorded
      }
    } else {
      const std::size_t k = rng() % live.size();
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    snapshot();
  }
  before.reset();
  snapshot();
  const MemoryTimeline t = a.take_timeline();
  EXPECT_FALSE(a.recording());
  EXPECT_EQ(t.rank, 2);
  EXPECT_EQ(t.world, 4);
  EXPECT_EQ(t.budget_bytes, 64 * MiB);
  EXPECT_EQ(t.initial[static_cast<std::size_t>(Component::params)], 3 * MiB + 256);
  ASSERT_EQ(t.events.size(), expected.size());
  ComponentBytes replay = t.initial;
  double last_t = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const MemoryEvent& e = t.events[i];
    EXPECT_EQ(std::llabs(e.delta) % 256, 0);
    EXPECT_GE(e.t, last_t);
    last_t = e.t;
    replay[e.component] = static_cast<std::uint64_t>(static_cast<std::int64_t>(replay[e.component]) + e.delta);
    ASSERT_EQ(replay, expected[i]) << "after event " << i;
  }
  // Nothing more once taken.
  Buffer after = a.allocate(Component::vocab, 1024);
  EXPECT_TRUE(a.take_timeline().events.empty());
}

TEST(MemoryTimeline, PhasesAndStepsAreMarked) {
  Arena a("test", 16 * MiB, nullptr);
  a.start_timeline();
  a.begin_step(1);
  mark_phase(a, "forward layer", 0);
  Buffer x = a.allocate(Component::layer, 1000);
  mark_phase(a, "loss");
  Buffer v = a.allocate(Component::vocab, 2000);
  {
    MemoryPhase p(a, "backward layer", 0);
    Buffer g = a.allocate(Component::grads, 300);
  }  // g released in "backward layer 0", then "loss" again
  v.reset();
  a.end_step();
  a.begin_step(2);
  mark_phase(a, "forward layer", 0);  // interned once
  x.reset();
  const MemoryTimeline t = a.take_timeline();
  ASSERT_EQ(t.phases, (std::vector<std::string>{"(none)", "forward layer 0", "loss", "backward layer 0"}));
  ASSERT_EQ(t.events.size(), 6u);
  // x+, v+, g+, g- (in the backward), v- (loss restored), x- (after step 2's mark).
  const std::vector<std::uint32_t> phase_of = {1, 2, 3, 3, 2, 1};
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(t.events[i].phase, phase_of[i]) << i;
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[0].step, 1);
  EXPECT_EQ(t.steps[0].event_begin, 0u);
  EXPECT_EQ(t.steps[0].event_end, 5u);
  EXPECT_GE(t.steps[0].t_end, t.steps[0].t_begin);
  EXPECT_EQ(t.steps[1].step, 2);
  EXPECT_LT(t.steps[1].t_end, 0);  // not ended
  // Marks: forward, loss, backward, loss (restored), forward.
  ASSERT_EQ(t.phase_marks.size(), 5u);
  EXPECT_EQ(t.phase_marks[3].phase, 2u);
  EXPECT_EQ(t.phase_marks[3].event_index, 4u);
}

TEST(MemoryTimeline, TheEventCapTruncates) {
  Arena a("test", 16 * MiB, nullptr);
  a.start_timeline(0, 1, 3);
  for (int i = 0; i < 4; ++i) Buffer b = a.allocate(Component::layer, 256);  // 8 events
  const MemoryTimeline t = a.take_timeline();
  EXPECT_EQ(t.events.size(), 3u);
  EXPECT_TRUE(t.truncated);
  EXPECT_TRUE(t.to_json()["truncated"].get<bool>());
}

TEST(MemoryTimeline, JsonRoundTrips) {
  Arena a("test", 16 * MiB, nullptr);
  Buffer p = a.allocate(Component::params, 5000);
  a.start_timeline(1, 2);
  a.begin_step(7);
  mark_phase(a, "optimizer");
  {
    Buffer o = a.allocate(Component::optimizer, 70000);
  }
  a.end_step();
  MemoryTimeline t = a.take_timeline();
  t.title = "tiny <moe> & co";
  t.meta = R"({"schedules":"none","seq_len":1024})";
  const std::string path = ::testing::TempDir() + "/timeline_roundtrip.json";
  write_memory_timeline(path, t);
  const MemoryTimeline r = read_memory_timeline(path);
  EXPECT_EQ(r.to_json(), t.to_json());
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world, 2);
  EXPECT_EQ(r.phases, t.phases);
  EXPECT_EQ(r.initial, t.initial);
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].delta, 70144);
  EXPECT_EQ(r.events[1].delta, -70144);
  EXPECT_EQ(r.events[0].component, static_cast<std::uint8_t>(Component::optimizer));
  EXPECT_EQ(r.steps.at(0).step, 7);
  EXPECT_EQ(nlohmann::json::parse(r.meta)["seq_len"], 1024);
  std::remove(path.c_str());
}

TEST(MemoryTimeline, BadJsonNamesTheField) {
  MemoryTimeline t;
  t.events.push_back({0.1, 512, 0, 5});
  t.events.push_back({0.2, -1024, 0, 5});  // releases more than is live
  nlohmann::json j = t.to_json();
  try {
    (void)MemoryTimeline::from_json(j);
    FAIL() << "accepted an over-release";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("events[1]"), std::string::npos) << e.what();
  }
  j = t.to_json();
  j.erase("budget_bytes");
  EXPECT_THROW((void)MemoryTimeline::from_json(j), InvalidArgument);
  j = MemoryTimeline{}.to_json();
  j["events"] = nlohmann::json::array({nlohmann::json::array({0.0, 12, 256, 0})});
  try {
    (void)MemoryTimeline::from_json(j);
    FAIL() << "accepted component 12";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("component index"), std::string::npos) << e.what();
  }
}

// Numbers at the ends of their types are refused with the field's name, never wrapped
// (found by tests/fuzz/fuzz_memory_timeline: signed overflow replaying the events, a
// step spanning 1e308 - -1e308 = inf seconds that hung the plot's tick loop).
TEST(MemoryTimeline, ExtremeNumbersAreRefusedNotWrapped) {
  auto refused = [](const nlohmann::json& j, const std::string& field) {
    try {
      (void)MemoryTimeline::from_json(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  const nlohmann::json base = MemoryTimeline{}.to_json();
  nlohmann::json j = base;
  j["events"] = {{0.0, 0, std::numeric_limits<std::int64_t>::min(), 0}};
  refused(j, "events[0]");
  j = base;
  j["initial_live_bytes"][0] = std::numeric_limits<std::int64_t>::max();
  j["events"] = {{0.0, 0, 5, 0}};
  refused(j, "initial_live_bytes");
  j = base;
  j["initial_live_bytes"][0] = std::uint64_t{1} << 61;
  j["events"] = {{0.0, 3, std::uint64_t{1} << 61, 0}, {0.0, 4, 1, 0}};
  refused(j, "events[1]");
  j = base;
  j["steps"] = {{{"step", 0}, {"t_begin", -1e308}, {"t_end", 1e308}, {"event_begin", 0}, {"event_end", 0}}};
  refused(j, "steps[0].t_begin");
  j = base;
  j["rank"] = std::uint64_t{1} << 32;
  j["world"] = (std::uint64_t{1} << 32) + 1;
  refused(j, "rank");
  // The largest accepted: 2^62 live bytes in all, released again.
  j = base;
  j["events"] = {{0.0, 0, std::uint64_t{1} << 62, 0}, {1e9, 0, -(std::int64_t{1} << 62), 0}};
  EXPECT_EQ(MemoryTimeline::from_json(j).events.size(), 2u);
}

TEST(MemoryTimeline, OneFilePerRankWithTheRankBeforeTheExtension) {
  EXPECT_EQ(memory_timeline_path("t.json", 0, 1), "t.json");
  EXPECT_EQ(memory_timeline_path("t.json", 0, 4), "t.rank-0.json");
  EXPECT_EQ(memory_timeline_path("/tmp/a.b/t.json", 3, 4), "/tmp/a.b/t.rank-3.json");
  EXPECT_EQ(memory_timeline_path("/tmp/a.b/timeline", 1, 2), "/tmp/a.b/timeline.rank-1");
  EXPECT_EQ(memory_timeline_path(".hidden", 1, 2), ".hidden.rank-1");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
