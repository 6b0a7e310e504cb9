#include "peakbound/comm/single_rank.h"

#include <gtest/gtest.h>

#include <vector>

#include "peakbound/core/error.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(SingleRank, CollectivesAreCopies) {
  SingleRankCommunicator c;
  EXPECT_EQ(c.size(), 1);
  std::vector<float> a = {1, 2, 3}, b(3);
  c.all_reduce(a.data(), 3, DType::f32, ReduceOp::sum);
  EXPECT_EQ(a[2], 3.0f);
  c.all_gather(a.data(), b.data(), 3, DType::f32);
  EXPECT_EQ(b, a);
  std::vector<std::size_t> n = {3}, z = {0};
  std::vector<float> r(3);
  c.all_to_all_v(a.data(), n, z, r.data(), n, z, DType::f32);
  EXPECT_EQ(r, a);
  c.ring_shift(a.data(), b.data(), 3, DType::f32);
  EXPECT_EQ(b, a);
}

TEST(SingleRank, SendToSelfThenReceive) {
  SingleRankCommunicator c;
  int x = 5, y = 0;
  c.send(&x, 1, DType::i32, 0, 9);
  c.recv(&y, 1, DType::i32, 0, 9);
  EXPECT_EQ(y, 5);
  Request rr = c.irecv(&y, 1, DType::i32, 0, 2);
  x = 6;
  c.isend(&x, 1, DType::i32, 0, 2).wait();
  rr.wait();
  EXPECT_EQ(y, 6);
}

TEST(SingleRank, ErrorsInsteadOfHanging) {
  SingleRankCommunicator c;
  int y;
  EXPECT_THROW(c.recv(&y, 1, DType::i32, 0, 1), CommError);
  EXPECT_THROW(c.send(&y, 1, DType::i32, 1, 0), CommError);
  EXPECT_THROW(c.broadcast(&y, 1, DType::i32, 2), CommError);
}

TEST(World, WithoutALauncherIsOneRank) {
  if (launched_by_mpi()) GTEST_SKIP() << "running under an MPI launcher";
  auto w = world_communicator();
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->backend(), "single");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
