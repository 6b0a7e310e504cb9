#include "peakbound/core/arena.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * 1024;

TEST(Arena, AlignsTo256AndPlacesInsideTheRegion) {
  std::vector<char> region(1 * MiB);
  Arena a("test", region.size(), region.data());
  Buffer b1 = a.allocate(Component::params, 1);
  Buffer b2 = a.allocate(Component::grads, 300);
  EXPECT_EQ(b1.bytes(), 256u);
  EXPECT_EQ(b2.bytes(), 512u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b1.data()) - reinterpret_cast<std::uintptr_t>(region.data()),
            b1.offset());
  EXPECT_EQ(b1.offset() % Arena::kAlignment, 0u);
  EXPECT_EQ(b2.offset() % Arena::kAlignment, 0u);
  EXPECT_NE(b1.offset(), b2.offset());
  EXPECT_EQ(a.live(), 768u);
}

TEST(Arena, TracksPerComponentPeaksAndTheBreakdownAtTheGlobalPeak) {
  Arena a("test", 16 * MiB, nullptr);  // measure-only
  Buffer p = a.allocate(Component::params, 4 * MiB);
  {
    Buffer d = a.allocate(Component::dispatch, 6 * MiB);  // global peak: params 4 + dispatch 6
  }
  Buffer v = a.allocate(Component::vocab, 3 * MiB);        // vocab peaks later, below the global peak
  EXPECT_EQ(a.peak(), 10 * MiB);
  EXPECT_EQ(a.peak(Component::dispatch), 6 * MiB);
  EXPECT_EQ(a.peak(Component::vocab), 3 * MiB);
  EXPECT_EQ(a.live(Component::dispatch), 0u);
  ComponentBytes at_peak = a.peak_breakdown();
  EXPECT_EQ(at_peak[static_cast<std::size_t>(Component::params)], 4 * MiB);
  EXPECT_EQ(at_peak[static_cast<std::size_t>(Component::dispatch)], 6 * MiB);
  EXPECT_EQ(at_peak[static_cast<std::size_t>(Component::vocab)], 0u);
  EXPECT_EQ(a.live(), 7 * MiB);
}

TEST(Arena, ErrorNamesComponentRequestBreakdownAndBudget) {
  Arena a("gpu0", 10 * MiB, nullptr);
  Buffer p = a.allocate(Component::params, 6 * MiB);
  Buffer g = a.allocate(Component::grads, 3 * MiB);
  try {
    a.allocate(Component::dispatch, 2 * MiB);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gpu0"), std::string::npos) << m;
    EXPECT_NE(m.find("'dispatch'"), std::string::npos) << m;
    EXPECT_NE(m.find("2.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("10.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("params 6.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("grads 3.00 MiB"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line";
  }
  // The failed request changed nothing.
  EXPECT_EQ(a.live(), 9 * MiB);
  EXPECT_EQ(a.peak(Component::dispatch), 0u);
}

TEST(Arena, FragmentationIsReportedAsSuch) {
  Arena a("frag", 4 * MiB, nullptr);
  Buffer b0 = a.allocate(Component::layer, 1 * MiB);
  Buffer b1 = a.allocate(Component::layer, 1 * MiB);
  Buffer b2 = a.allocate(Component::layer, 1 * MiB);
  Buffer b3 = a.allocate(Component::layer, 1 * MiB);
  b0.reset();
  b2.reset();  // 2 MiB free, in two 1 MiB holes
  try {
    a.allocate(Component::vocab, 2 * MiB);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("fragmented"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.largest_free_block(), 1 * MiB);
}

TEST(Arena, CoalescesFreedNeighboursAndReusesBestFit) {
  Arena a("coalesce", 4 * MiB, nullptr);
  Buffer b0 = a.allocate(Component::layer, 1 * MiB);
  Buffer b1 = a.allocate(Component::layer, 1 * MiB);
  Buffer b2 = a.allocate(Component::layer, 1 * MiB);
  Buffer small = a.allocate(Component::layer, 256 * KiB);
  b0.reset();
  b1.reset();  // b0+b1 merge into one 2 MiB hole at offset 0
  Buffer big = a.allocate(Component::vocab, 2 * MiB);
  EXPECT_EQ(big.offset(), 0u);
  b2.reset();
  small.reset();
  big.reset();
  EXPECT_EQ(a.largest_free_block(), 4 * MiB);
  EXPECT_EQ(a.live(), 0u);
  // Best fit: a 256 KiB request goes to the 256 KiB hole, not the larger one.
  Buffer x0 = a.allocate(Component::layer, 1 * MiB);
  Buffer hole = a.allocate(Component::layer, 256 * KiB);
  Buffer x1 = a.allocate(Component::layer, 1 * MiB);
  std::uint64_t hole_offset = hole.offset();
  hole.reset();
  Buffer fit = a.allocate(Component::workspace, 200 * KiB);
  EXPECT_EQ(fit.offset(), hole_offset);
}

TEST(Arena, HighWaterOffsetShowsHowFarPlacementReached) {
  Arena a("hw", 8 * MiB, nullptr);
  Buffer b0 = a.allocate(Component::layer, 1 * MiB);
  Buffer b1 = a.allocate(Component::layer, 2 * MiB);
  EXPECT_EQ(a.high_water_offset(), 3 * MiB);
  b1.reset();
  EXPECT_EQ(a.high_water_offset(), 3 * MiB);  // a high-water mark does not fall on free
  a.reset_peaks();
  EXPECT_EQ(a.high_water_offset(), 1 * MiB);
  EXPECT_EQ(a.peak(), 1 * MiB);
}

TEST(Arena, ZeroByteRequestsAreEmptyAndAccountNothing) {
  Arena a("zero", 1 * MiB, nullptr);
  Buffer z = a.allocate(Component::dispatch, 0);
  EXPECT_TRUE(z.empty());
  EXPECT_EQ(z.data(), nullptr);
  EXPECT_EQ(a.live(), 0u);
}

TEST(Arena, RequestLargerThanTheWholeBudget) {
  Arena a("small", 1 * MiB, nullptr);
  EXPECT_THROW(a.allocate(Component::vocab, 2 * MiB), OutOfBudget);
  EXPECT_THROW(a.allocate(Component::vocab, ~0ull), OutOfBudget);
}

TEST(Arena, ReportJsonAndTable) {
  Arena a("rep", 4 * MiB, nullptr);
  Buffer p = a.allocate(Component::params, 1 * MiB);
  { Buffer c = a.allocate(Component::checkpoints, 2 * MiB); }
  nlohmann::json j = a.report_json();
  EXPECT_EQ(j["budget_bytes"].get<std::uint64_t>(), 4 * MiB);
  EXPECT_EQ(j["peak_bytes"].get<std::uint64_t>(), 3 * MiB);
  EXPECT_EQ(j["components"]["checkpoints"]["peak_bytes"].get<std::uint64_t>(), 2 * MiB);
  EXPECT_EQ(j["components"]["checkpoints"]["live_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["components"]["params"]["at_global_peak_bytes"].get<std::uint64_t>(), 1 * MiB);
  EXPECT_EQ(j["high_water_offset_bytes"].get<std::uint64_t>(), 3 * MiB);
  std::string t = a.report_table();
  EXPECT_NE(t.find("checkpoints"), std::string::npos);
  EXPECT_NE(t.find("2.00 MiB"), std::string::npos);
  EXPECT_EQ(t.find("dispatch"), std::string::npos) << "unused components are not listed";
}

TEST(Arena, BufferMoveTransfersOwnership) {
  Arena a("move", 1 * MiB, nullptr);
  Buffer b = a.allocate(Component::layer, 1000);
  Buffer c = std::move(b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(a.live(), 1024u);
  c = Buffer();
  EXPECT_EQ(a.live(), 0u);
}

TEST(HostMemory, AccountsPerComponentUnderItsBudget) {
  HostMemory unlimited;
  Buffer big = unlimited.allocate(Component::optimizer, 3 * MiB);
  EXPECT_NE(big.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % Arena::kAlignment, 0u);
  EXPECT_EQ(unlimited.peak(Component::optimizer), 3 * MiB);

  HostMemory host(2 * MiB, "host0");
  Buffer c = host.allocate(Component::checkpoints, 1 * MiB);
  try {
    host.allocate(Component::optimizer, 2 * MiB);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("host0"), std::string::npos) << m;
    EXPECT_NE(m.find("'optimizer'"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoints 1.00 MiB"), std::string::npos) << m;
  }
  c.reset();
  EXPECT_EQ(host.live(), 0u);
  EXPECT_EQ(host.peak(), 1 * MiB);
}

// Staggering: with a stagger reserve, large placements start at distinct offsets
// within a 4 KiB page, the ledger counts the requests only, and requests that fill
// the budget back to back still fit (the shifts come out of the reserve).
TEST(ArenaStagger, BackToBackLargePlacementsStartAtDistinctPageOffsets) {
  Arena a("stagger", 16 * MiB, nullptr, Location::device, Arena::kStaggerReserve);
  std::vector<Buffer> bufs;
  std::set<std::uint64_t> page_offsets;
  for (int i = 0; i < 5; ++i) {
    bufs.push_back(a.allocate(Component::optimizer, 1 * MiB));
    EXPECT_EQ(bufs.back().offset() % Arena::kAlignment, 0u);
    page_offsets.insert(bufs.back().offset() % Arena::kStaggerPeriod);
  }
  EXPECT_EQ(page_offsets.size(), 5u) << "power-of-two buffers placed back to back alias in cache";
  EXPECT_EQ(a.live(Component::optimizer), 5 * MiB);  // the shifts are not live bytes
  EXPECT_EQ(a.peak(Component::optimizer), 5 * MiB);
  EXPECT_GT(a.high_water_offset(), 5 * MiB);           // they show as fragmentation
  EXPECT_LT(a.high_water_offset(), 5 * MiB + 5 * Arena::kStaggerPeriod);
  EXPECT_EQ(a.largest_free_block(), 11 * MiB);         // never more than the unspent budget
  bufs.clear();
  EXPECT_EQ(a.largest_free_block(), 16 * MiB) << "the skipped bytes coalesce back";
}

TEST(ArenaStagger, WithoutAReserveNothingIsShifted) {
  Arena a("plain", 4 * MiB, nullptr);
  Buffer b0 = a.allocate(Component::layer, 1 * MiB);
  Buffer b1 = a.allocate(Component::layer, 1 * MiB);
  EXPECT_EQ(b1.offset(), 1 * MiB);
}

TEST(ArenaStagger, AnExactBudgetStillHoldsItsRequests) {
  // Four 1 MiB buffers in a 4 MiB budget: each shift comes out of the reserve.
  Arena a("exact", 4 * MiB, nullptr, Location::device, Arena::kStaggerReserve);
  std::vector<Buffer> bufs;
  for (int i = 0; i < 4; ++i) bufs.push_back(a.allocate(Component::optimizer, 1 * MiB));
  EXPECT_NE(bufs[1].offset() % Arena::kStaggerPeriod, bufs[2].offset() % Arena::kStaggerPeriod);
  EXPECT_EQ(a.live(), 4 * MiB);
  try {
    a.allocate(Component::workspace, 256);  // the reserve is not budget
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("'workspace'"), std::string::npos) << e.what();
  }
}

TEST(ArenaStagger, ShiftsStopWhenTheReserveIsSpent) {
  Arena a("tight", 8 * MiB, nullptr, Location::device, 512);
  Buffer b0 = a.allocate(Component::layer, 1 * MiB);  // slot 0: no shift
  Buffer b1 = a.allocate(Component::layer, 1 * MiB);  // slot 1: 256
  Buffer b2 = a.allocate(Component::layer, 1 * MiB);  // slot 2: 256 more, 512 in all
  Buffer b3 = a.allocate(Component::layer, 1 * MiB);  // slot 3: the reserve is spent
  EXPECT_EQ(b1.offset(), 1 * MiB + 256);
  EXPECT_EQ(b2.offset(), 2 * MiB + 512);
  EXPECT_EQ(b3.offset(), 3 * MiB + 512);
  EXPECT_EQ(a.live(), 4 * MiB);
}

TEST(ArenaStagger, SmallRequestsArePackedAndFillTheSkippedBytes) {
  Arena a("small", 4 * MiB, nullptr, Location::device, Arena::kStaggerReserve);
  Buffer s0 = a.allocate(Component::workspace, 1000);
  Buffer s1 = a.allocate(Component::workspace, 1000);
  EXPECT_EQ(s1.offset(), s0.offset() + 1024);  // below kStaggerMin: no shift
  Buffer big0 = a.allocate(Component::layer, 1 * MiB);
  Buffer big1 = a.allocate(Component::layer, 1 * MiB);
  EXPECT_NE(big0.offset() % Arena::kStaggerPeriod, big1.offset() % Arena::kStaggerPeriod);
  // A small request takes the best-fitting free block: bytes a shift skipped.
  Buffer fill = a.allocate(Component::workspace, 256);
  EXPECT_LT(fill.offset(), big1.offset());
  EXPECT_GE(fill.offset(), big0.offset() + 1 * MiB);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
