// main() of the mpi-labelled tests: one world communicator for the whole run; only
// rank 0 prints GoogleTest's progress, the other ranks print only their failures (with
// their rank), and the exit code is non-zero if any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "peakbound/comm/communicator.h"
#include "peakbound/ops/gemm.h"
#include "tests/comm/world.h"

namespace peakbound::testing {

Communicator& world() {
  static std::unique_ptr<Communicator> w = world_communicator();
  return *w;
}

}  // namespace peakbound::testing

namespace {

// A failure seen only by a rank other than 0 would otherwise be silent.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed()) std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  peakbound::ops::prefer_blas_kernels(argv);  // the kernels the CLI runs with (ops/gemm.h)
  ::testing::InitGoogleTest(&argc, argv);
  auto& w = peakbound::testing::world();
  if (w.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(w.rank()));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  w.all_reduce(&failed, 1, peakbound::DType::i32, peakbound::ReduceOp::max);
  if (failed && w.rank() == 0) std::fprintf(stderr, "mpi tests: a rank failed (size %d)\n", w.size());
  return failed;
}
