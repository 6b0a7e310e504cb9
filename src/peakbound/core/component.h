// Component: what a block of memory is for. Every Arena allocation names one, so
// peaks are reported per component and an out-of-budget error names the culprit.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace peakbound {

enum class Component : std::uint8_t {
  params,       // model parameters (device shards or gathered layers)
  grads,        // parameter gradients
  optimizer,    // fp32 master weights, Adam m and v
  checkpoints,  // activation-checkpoint boundaries (one layer input per layer)
  dispatch,     // MoE routed-token buffers and expert intermediates
  vocab,        // LM-head logits, their gradient, ring buffers
  attention,    // attention working set
  layer,        // other per-layer activations (norms, MLP)
  comm,         // communication staging buffers
  workspace,    // scratch (GEMM workspace, reductions)
};

inline constexpr std::size_t kNumComponents = 10;

inline constexpr std::array<Component, kNumComponents> kAllComponents = {
    Component::params,    Component::grads, Component::optimizer, Component::checkpoints,
    Component::dispatch,  Component::vocab, Component::attention, Component::layer,
    Component::comm,      Component::workspace};

std::string_view component_name(Component c);
// Throws InvalidArgument listing the valid names.
Component parse_component(std::string_view name);

}  // namespace peakbound
