// The checkpointed stack's footprint is the truth: over a grid of layer counts,
// prefetch depths, resident counts and odd token/hidden sizes (boundaries that are not
// a multiple of the Arena's 256-byte alignment), the Arena's measured peaks per
// component and per phase, and host memory's, equal checkpoint_run_footprint exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/bench/checkpoint_run.h"
#include "peakbound/core/error.h"
#include "peakbound/schedules/checkpoint_policy.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t kF32 = 4;

std::uint64_t dev_at(const Footprint& f, const char* phase, Component c) {
  return f.phase(phase).device[static_cast<std::size_t>(c)];
}
std::uint64_t host_at(const Footprint& f, const char* phase, Component c) {
  return f.phase(phase).host[static_cast<std::size_t>(c)];
}

CheckpointRunConfig odd(std::int64_t L, CheckpointSchedule s, std::int64_t D, std::optional<std::int64_t> K) {
  CheckpointRunConfig c;
  c.layers = L;
  c.tokens = 37;  // 37 x 13 x 4 = 1924 bytes: not a multiple of 256
  c.hidden = 13;
  c.ffn = 22;
  c.seed = 5;
  c.options.schedule = s;
  c.options.prefetch_depth = D;
  c.options.resident_layers = K;
  return c;
}

struct PhasePeaks {
  ComponentBytes device{};
  std::uint64_t device_total = 0;
  std::uint64_t host_checkpoints = 0;
};

PhasePeaks read_peaks(CheckpointRun& r) {
  PhasePeaks p;
  for (Component c : kAllComponents) p.device[static_cast<std::size_t>(c)] = r.device().arena().peak(c);
  p.device_total = r.device().arena().peak();
  p.host_checkpoints = r.host().peak(Component::checkpoints);
  return p;
}

// One step with the peaks of forward and backward measured apart. y and dx are the
// test's own, under workspace, so every other component is the run's alone.
std::vector<PhasePeaks> measured_step(CheckpointRun& r) {
  const CheckpointRunConfig& c = r.config();
  const auto bytes = static_cast<std::uint64_t>(c.tokens * c.hidden) * kF32;
  Buffer y = r.device().allocate(Component::workspace, bytes), dx = r.device().allocate(Component::workspace, bytes);
  const Shape s{c.tokens, c.hidden};
  for (auto& b : r.blocks()) b->zero_grad();
  std::vector<PhasePeaks> out;
  r.device().arena().reset_peaks();
  r.host().reset_peaks();
  r.stack().forward(r.input(), y.tensor(s, DType::f32));
  out.push_back(read_peaks(r));
  r.device().arena().reset_peaks();
  r.host().reset_peaks();
  r.stack().backward(r.output_grad(), dx.tensor(s, DType::f32));
  r.device().synchronize();
  out.push_back(read_peaks(r));
  // Without the test's two workspace buffers, for the total.
  for (PhasePeaks& p : out) p.device_total -= 2 * arena_reserved(bytes);
  return out;
}

void expect_measured_is_footprint(CheckpointRun& r, const std::string& what) {
  const Footprint f = checkpoint_run_footprint(r.config(), kF32);
  const Footprint stack = checkpoint_footprint(r.stack().buffers());
  for (int step = 0; step < 2; ++step) {  // the second step reuses the ring and host buffers
    const std::vector<PhasePeaks> m = measured_step(r);
    const char* phases[] = {"forward", "backward"};
    for (int i = 0; i < 2; ++i) {
      const char* ph = phases[i];
      const std::string at = what + " step " + std::to_string(step) + " " + ph;
      for (Component c : {Component::checkpoints, Component::layer, Component::params, Component::grads})
        EXPECT_EQ(m[i].device[static_cast<std::size_t>(c)], dev_at(f, ph, c)) << at << " " << component_name(c);
      EXPECT_EQ(m[i].device_total, f.phase(ph).device_total()) << at << " total";
      EXPECT_EQ(m[i].host_checkpoints, host_at(f, ph, Component::checkpoints)) << at << " host";
      // The stack's own footprint is where the checkpoint bytes come from.
      EXPECT_EQ(m[i].device[static_cast<std::size_t>(Component::checkpoints)],
                dev_at(stack, ph, Component::checkpoints)) << at;
      EXPECT_EQ(m[i].host_checkpoints, host_at(stack, ph, Component::checkpoints)) << at;
    }
  }
  EXPECT_EQ(r.device().arena().peak(Component::checkpoints), f.device_peak(Component::checkpoints)) << what;
}

TEST(CheckpointFootprint, MeasuredPeaksEqualTheFootprintPerPhaseOverTheGrid) {
  for (std::int64_t L : {1, 2, 3, 4, 7}) {
    CheckpointRun base(odd(L, CheckpointSchedule::resident, 1, std::nullopt));
    expect_measured_is_footprint(base, "resident L=" + std::to_string(L));
    for (std::int64_t D : {0, 1, 2, 5}) {
      std::vector<std::int64_t> ks = {0, 1, L / 2, L};
      std::sort(ks.begin(), ks.end());
      ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
      for (std::int64_t K : ks) {
        CheckpointRun sco(odd(L, CheckpointSchedule::sco, D, K));
        expect_measured_is_footprint(sco, "sco L=" + std::to_string(L) + " D=" + std::to_string(D) +
                                              " K=" + std::to_string(K));
      }
    }
  }
}

TEST(CheckpointFootprint, TheBudgetPolicyIsMeasuredAsTheFootprintSaysToo) {
  const std::uint64_t b = arena_reserved(37 * 13 * 4);
  CheckpointRunConfig c = odd(7, CheckpointSchedule::sco, 2, std::nullopt);
  c.options.checkpoint_budget = 5 * b + 7;  // a ring of 3 and two resident
  CheckpointRun r(c);
  EXPECT_EQ(r.stack().placement().resident, 2);
  expect_measured_is_footprint(r, "budget");
}

TEST(CheckpointFootprint, SlotsAndBytesFollowThePlacement) {
  CheckpointOptions o;
  o.prefetch_depth = 1;
  o.resident_layers = 0;
  const std::uint64_t b = arena_reserved(37 * 13 * 2);
  // L = 8, D = 1: a ring of D + 1 = 2 on the device, 6 boundaries on the host.
  Footprint f = checkpoint_footprint(8, 37 * 13, 2, o);
  EXPECT_EQ(f.device_peak(Component::checkpoints), 2 * b);
  EXPECT_EQ(f.host_peak(Component::checkpoints), 6 * b);
  EXPECT_EQ(dev_at(f, "forward", Component::layer), 0u);
  EXPECT_EQ(dev_at(f, "backward", Component::layer), 2 * b);  // the gradient ping-pong
  // No more layers than the ring: min(L, D + 1) slots, nothing offloaded.
  f = checkpoint_footprint(2, 37 * 13, 2, o);
  EXPECT_EQ(f.device_peak(Component::checkpoints), 2 * b);
  EXPECT_EQ(f.host_peak_total(), 0u);
  // One layer: no ping-pong, the block writes dx.
  EXPECT_EQ(checkpoint_footprint(1, 37 * 13, 2, o).device_peak(Component::layer), 0u);
  // Resident: every boundary on the device.
  o.schedule = CheckpointSchedule::resident;
  EXPECT_EQ(checkpoint_footprint(8, 37 * 13, 2, o).device_peak(Component::checkpoints), 8 * b);
  EXPECT_EQ(checkpoint_footprint(8, 37 * 13, 2, o).host_peak_total(), 0u);
}

TEST(CheckpointFootprint, ModelScaleIsExactAndOverflowIsAnError) {
  // 48 layers, 8192 tokens x 4096 hidden in bf16 (64 MiB boundaries), prefetch depth 2,
  // a 1 GiB checkpoint budget: 16 boundaries fit, 3 of them the ring, so 13 resident.
  CheckpointOptions o;
  o.prefetch_depth = 2;
  o.checkpoint_budget = 1ull << 30;
  const std::uint64_t b = 8192ull * 4096 * 2;
  const CheckpointBuffers bufs = checkpoint_buffers(48, 8192ull * 4096, 2, o);
  EXPECT_EQ(bufs.placement.resident, 13);
  EXPECT_EQ(bufs.placement.ring_slots, 3);
  EXPECT_EQ(bufs.placement.offloaded, 32);
  const Footprint f = checkpoint_footprint(bufs);
  EXPECT_EQ(f.device_peak(Component::checkpoints), 16 * b);
  EXPECT_EQ(f.host_peak(Component::checkpoints), 32 * b);
  EXPECT_EQ(f.device_peak_total(), 18 * b);
  EXPECT_THROW(checkpoint_footprint(4, std::numeric_limits<std::uint64_t>::max() / 2, 4, o), InvalidArgument);
}

TEST(CheckpointFootprint, ErrorsNameTheOption) {
  auto message = [](CheckpointOptions o) -> std::string {
    try {
      checkpoint_footprint(4, 100, 4, o);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  CheckpointOptions o;
  o.prefetch_depth = -1;
  EXPECT_NE(message(o).find("checkpoint prefetch_depth must be >= 0"), std::string::npos) << message(o);
  o = {};
  o.resident_layers = -5;
  EXPECT_NE(message(o).find("checkpoint resident_layers must be >= 0"), std::string::npos) << message(o);
  o.resident_layers = 5;
  EXPECT_NE(message(o).find("checkpoint resident_layers must be between 0 and the layer count 4"), std::string::npos);
  o = {};
  for (double bad : {1e-9, 0.0009, -1.0, std::numeric_limits<double>::infinity()}) {
    o.link_gbps = bad;
    EXPECT_NE(message(o).find("checkpoint link_gbps must be 0 (off) or an emulated bandwidth of at least 0.001"),
              std::string::npos) << bad << ": " << message(o);
  }
  o.link_gbps = CheckpointOptions::kMinLinkGbps;
  EXPECT_EQ(message(o), "no error");
  CheckpointRunConfig c;
  c.device_memory = 0;
  EXPECT_THROW(c.validate(), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
