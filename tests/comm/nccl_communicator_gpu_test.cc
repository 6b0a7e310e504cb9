// NcclCommunicator on one GPU (one rank, bootstrapped over the single-rank communicator):
// NCCL initialises, and the collectives move device buffers with the single-rank
// semantics (all_reduce leaves the data, all_gather and all_to_all_v copy it, a split
// gives a working sub-communicator). Multi-rank NCCL needs several GPUs; these run on
// one; host buffers go over the bootstrap. Skips without a GPU (or in a build without NCCL).
#include <numeric>

#include "tests/device/gpu_test_util.h"

#ifdef PEAKBOUND_HAVE_NCCL
#include "peakbound/comm/nccl/nccl_communicator.h"
#include "peakbound/comm/single_rank.h"
#endif

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(NcclCommunicator, OneRankCollectivesMoveDeviceBuffers) {
#ifndef PEAKBOUND_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  PB_NEED_GPU();
  CudaDevice dev(64 * testing::kMiB);
  NcclCommunicator comm(dev, std::make_unique<SingleRankCommunicator>());
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend(), "nccl");
  std::vector<float> v(1000);
  std::iota(v.begin(), v.end(), 1.0f);
  Buffer a = testing::upload(dev, v), b = testing::upload(dev, std::vector<float>(1000, 0.0f));
  dev.synchronize();
  comm.all_reduce(a.data(), 1000, DType::f32, ReduceOp::sum);
  comm.all_gather(a.data(), b.data(), 1000, DType::f32);
  EXPECT_EQ(testing::download(dev, b, 1000), v);
  const std::size_t counts[1] = {600}, displs[1] = {100}, rdispls[1] = {0};
  comm.all_to_all_v(a.data(), counts, displs, b.data(), counts, rdispls, DType::f32);
  const std::vector<float> got = testing::download(dev, b, 600);
  EXPECT_EQ(got, std::vector<float>(v.begin() + 100, v.begin() + 700));
  std::unique_ptr<Communicator> sub = comm.split(0, 0);
  sub->broadcast(a.data(), 1000, DType::f32, 0);
  EXPECT_EQ(testing::download(dev, a, 1000), v);
  EXPECT_THROW(comm.broadcast(a.data(), 10, DType::f32, 3), InvalidArgument);
  // Host buffers (a schedule's counts) go over the bootstrap; a host/GPU mix is refused.
  std::int64_t counts_host[2] = {7, 9}, gathered[2] = {0, 0};
  comm.all_reduce(counts_host, 2, DType::i64, ReduceOp::max);
  comm.all_gather(counts_host, gathered, 2, DType::i64);
  EXPECT_EQ(gathered[0], 7);
  EXPECT_EQ(gathered[1], 9);
  EXPECT_THROW(comm.all_gather(a.data(), v.data(), 10, DType::f32), InvalidArgument);
#endif
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
