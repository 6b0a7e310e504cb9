// main() of the mpi-labelled tests: one world communicator for the whole run; only
// rank 0 prints GoogleTest's progress, and the exit code is non-zero if any rank failed.
#include <gtest/gtest.h>

#include "peakbound/comm/communicator.h"
#include "tests/comm/world.h"

namespace peakbound::testing {

Communicator& world() {
  static std::unique_ptr<Communicator> w = world_communicator();
  return *w;
}

}  // namespace peakbound::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& w = peakbound::testing::world();
  if (w.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  w.all_reduce(&failed, 1, peakbound::DType::i32, peakbound::ReduceOp::max);
  if (failed && w.rank() == 0) std::fprintf(stderr, "mpi tests: a rank failed (size %d)\n", w.size());
  return failed;
}
