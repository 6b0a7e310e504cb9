// What the layer tests check alike: a device tensor read back as floats, and that a
// layer's backward adds into its parameter gradients and writes dx.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/buffer.h"
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

// A device tensor of shape s and dtype dt (f32 or bf16, rounded to nearest) holding v
// (empty: zeros), its buffer kept in `keep`.
inline Tensor put(Device& dev, std::vector<Buffer>& keep, const std::vector<float>& v, Shape s, DType dt,
                  Component comp) {
  keep.push_back(dev.allocate(comp, std::max<std::uint64_t>(static_cast<std::uint64_t>(s.numel()) * dtype_size(dt), 4)));
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    const float x = v.empty() ? 0.0f : v[static_cast<std::size_t>(i)];
    if (dt == DType::bf16)
      keep.back().as<bf16>()[i] = to_bf16(x);
    else
      keep.back().as<float>()[i] = x;
  }
  return Tensor(keep.back().data(), s, dt, Location::device);
}

// max|got - ref| / max|ref| over the rows every rank of w holds (each its own got and ref):
// the largest error over the world against the largest reference value.
inline double world_max_relative(Communicator& w, const std::vector<float>& got, const std::vector<float>& ref) {
  double both[2] = {0, 0};
  for (std::size_t i = 0; i < ref.size(); ++i) {
    both[0] = std::max(both[0], std::abs(double(got[i]) - ref[i]));
    both[1] = std::max(both[1], std::abs(double(ref[i])));
  }
  w.all_reduce(both, 2, DType::f64, ReduceOp::max);
  return both[0] / both[1];
}

// max|got - ref| / max|ref| over the whole tensor (the project's relative error).
inline double max_relative(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return err / scale;
}

// cos(a, b) of two gradients (a gradient's direction against a reference's): 1 when both
// are exactly zero (an expert no token chose), 0 when only one is.
inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 1.0;
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
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
