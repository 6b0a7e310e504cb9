#include "peakbound/core/tensor.h"

#include <gtest/gtest.h>

#include <vector>

#include "peakbound/core/arena.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Tensor, ShapesRowsAndViews) {
  std::vector<float> data(24);
  for (int i = 0; i < 24; ++i) data[static_cast<std::size_t>(i)] = static_cast<float>(i);
  Tensor t(data.data(), Shape{4, 6}, DType::f32, Location::host);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 6}));
  EXPECT_EQ(r.data<float>()[0], 6.0f);
  Tensor v = t.view(Shape{2, 3, 4});
  EXPECT_EQ(v.dim(2), 4);
  EXPECT_THROW(t.view(Shape{5, 5}), InternalError);
  EXPECT_THROW(t.rows(2, 5), InternalError);
  EXPECT_THROW(t.data<bf16>(), InternalError);
  EXPECT_EQ(Shape({}).numel(), 1);
  EXPECT_EQ((Shape{3, 0}).numel(), 0);
  EXPECT_EQ(t.shape().str(), "[4, 6]");
}

TEST(Tensor, FromBufferChecksCapacity) {
  Arena a("t", 1 << 20, nullptr);
  Buffer b = a.allocate(Component::layer, 1000);
  Tensor t = b.tensor(Shape{10, 25}, DType::f32);
  EXPECT_EQ(t.location(), Location::device);
  EXPECT_THROW(b.tensor(Shape{10, 26}, DType::f32), InternalError);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
