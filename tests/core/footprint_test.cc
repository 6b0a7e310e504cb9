// Footprint: phases, per-component peaks, the Arena's rounding, overflow as an error.
#include <gtest/gtest.h>

#include <limits>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"
#include "peakbound/core/footprint.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Footprint, ReservedBytesMatchTheArena) {
  Arena arena("t", 1 << 20, nullptr);
  for (std::uint64_t b : {0ull, 1ull, 255ull, 256ull, 257ull, 1000ull}) {
    Buffer buf = arena.allocate(Component::vocab, b);
    EXPECT_EQ(arena.live(Component::vocab), arena_reserved(b)) << b;
  }
}

TEST(Footprint, PeakIsTheMaxOverPhasesNotTheSumOfMaxima) {
  Footprint f("x");
  f.device("forward", {Component::vocab, 1000}).device("forward", {Component::layer, 256}, 2);
  f.device("backward", {Component::vocab, 256}).device("backward", {Component::layer, 4096});
  f.host("forward", {Component::checkpoints, 100});
  EXPECT_EQ(f.phase("forward").device_total(), 1024u + 512u);
  EXPECT_EQ(f.device_peak(Component::vocab), 1024u);
  EXPECT_EQ(f.device_peak(Component::layer), 4096u);
  EXPECT_EQ(f.device_peak_total(), 4096u + 256u);
  EXPECT_EQ(f.host_peak(Component::checkpoints), 256u);
  Footprint g("y");
  g.device("forward", {Component::vocab, 256});
  f.merge(g);
  EXPECT_EQ(f.phase("forward").device[static_cast<std::size_t>(Component::vocab)], 1024u + 256u);
}

TEST(Footprint, OverflowIsAnErrorNotAWrappedNumber) {
  const std::uint64_t big = std::numeric_limits<std::uint64_t>::max() / 2;
  EXPECT_THROW(buffer_spec(Component::vocab, big, 4), InvalidArgument);
  Footprint f("x");
  EXPECT_THROW(f.device("p", {Component::vocab, big}, 3), InvalidArgument);
  EXPECT_THROW(arena_reserved(std::numeric_limits<std::uint64_t>::max()), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
