// main() of the single-process test binaries: OpenBLAS's kernels chosen as the CLI's are
// (ops::prefer_blas_kernels, before anything runs), then GoogleTest.
#include <gtest/gtest.h>

#include "peakbound/ops/gemm.h"

int main(int argc, char** argv) {
  peakbound::ops::prefer_blas_kernels(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
