// What the layer tests check alike: a device tensor read back as floats, and that a
// layer's backward adds into its parameter gradients and writes dx.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "peakbound/core/tensor.h"
#include "peakbound/device/device.h"

namespace peakbound::layer_test {

// A device tensor's values (f32 or bf16) as floats.
inline std::vector<float> host(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::bf16 ? to_f32(t.data<bf16>()[i]) : t.data<float>()[i];
  return v;
}

// After one call of `backward` (which runs the layer's backward into dx and synchronizes),
// a second call doubles every parameter gradient (added into: within 1e-5 of twice the
// first call's, relative to 1 + |2 g|, as kernels accumulating row by row round) and
// writes dx again (the same values); zero_grad then clears every gradient.
template <class Layer>
void expect_backward_adds_into_grads(Layer& layer, Device& dev, const std::function<void()>& backward,
                                     const Tensor& dx) {
  const auto params = layer.parameters();
  std::vector<std::vector<float>> once;
  for (const auto& p : params) once.push_back(host(p.grad));
  const std::vector<float> dx1 = host(dx);
  backward();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::vector<float> twice = host(params[k].grad);
    for (std::size_t i = 0; i < twice.size(); ++i)
      ASSERT_NEAR(twice[i], 2 * once[k][i], 1e-5 * (1 + std::abs(2 * once[k][i]))) << params[k].name;
  }
  EXPECT_EQ(host(dx), dx1);
  layer.zero_grad();
  dev.synchronize();
  for (const auto& p : params)
    for (float v : host(p.grad)) ASSERT_EQ(v, 0.0f) << p.name;
}

}  // namespace peakbound::layer_test
