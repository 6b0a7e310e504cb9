// The residual MLP block allocates from its footprint: measured Arena peaks of one
// forward and one backward call, per component, equal residual_mlp_footprint.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/layers/residual_mlp_block.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(ResidualMlpFootprint, MeasuredPeaksPerPhaseEqualTheFootprint) {
  for (auto [T, H, F] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{37, 13, 22}, {1, 7, 3}, {64, 32, 96}}) {
    CpuDevice dev(64 << 20);
    const auto bytes = static_cast<std::uint64_t>(T * H) * 4;
    // The test's tensors under workspace, so params, grads and layer are the block's alone.
    Buffer x = dev.allocate(Component::workspace, bytes), y = dev.allocate(Component::workspace, bytes);
    Buffer dy = dev.allocate(Component::workspace, bytes), dx = dev.allocate(Component::workspace, bytes);
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (std::int64_t i = 0; i < T * H; ++i) x.as<float>()[i] = dy.as<float>()[i] = d(rng);
    ResidualMlpBlock block(dev, H, F, 11);
    const Footprint f = residual_mlp_footprint(T, H, F, 4);
    const Shape s{T, H};
    auto check = [&](const char* phase) {
      for (Component c : {Component::params, Component::grads, Component::layer})
        EXPECT_EQ(dev.arena().peak(c), f.phase(phase).device[static_cast<std::size_t>(c)])
            << phase << " " << component_name(c) << " T=" << T;
      EXPECT_EQ(dev.arena().live(Component::layer), 0u);  // nothing outlives the call
    };
    dev.arena().reset_peaks();
    block.forward(x.tensor(s, DType::f32), y.tensor(s, DType::f32));
    check("forward");
    dev.arena().reset_peaks();
    block.backward(x.tensor(s, DType::f32), dy.tensor(s, DType::f32), dx.tensor(s, DType::f32));
    check("backward");
    const ResidualMlpParamBuffers p = residual_mlp_param_buffers(H, F, 2);
    EXPECT_EQ(p.params.bytes, static_cast<std::uint64_t>(H + 3 * H * F) * 2);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
