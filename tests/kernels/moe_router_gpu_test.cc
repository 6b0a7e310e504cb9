// The CUDA backend's MoE router against the CPU backend: softmax, top-k with ties (the
// same ids in the same order), the statistics added into, the aux loss, and the backward
// with and without renormalization and the aux term. Skips without a GPU.
#include <cstring>

#include "peakbound/ops/moe_router.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::f;
using testing::randn;
using testing::same_on_both;

TEST(CudaKernels, MoeRouterMatchesCpuIncludingTies) {
  PB_NEED_GPU();
  const std::int64_t T = 37, E = 60, K = 4;
  std::vector<float> logits = randn(static_cast<std::size_t>(T * E), 1);
  for (std::int64_t t = 0; t < T; t += 3)  // exact ties at the top: the lower index goes first
    for (std::int64_t e = 0; e < 6; ++e) logits[static_cast<std::size_t>(t * E + e * 7)] = 5.0f;
  const auto te = static_cast<std::size_t>(T * E), tk = static_cast<std::size_t>(T * K), ze = static_cast<std::size_t>(E);
  for (bool norm : {false, true}) {
    std::vector<std::vector<std::int32_t>> ids(2);
    int which = 0;
    // logits, probs, ids (int bits), weights, counts, prob_sums, loss, aux_grad, dweights, dlogits
    same_on_both({logits, randn(te, 2), std::vector<float>(tk, 0.0f), randn(tk, 3), randn(ze, 4), randn(ze, 5),
                  randn(1, 6), randn(ze, 7), randn(tk, 8), randn(te, 9)},
                 [&](Device& dev, std::vector<Buffer>& b) {
                   Stream& s = dev.compute_stream();
                   auto* id = static_cast<std::int32_t*>(b[2].data());
                   ops::moe_router_forward(dev, s, f(b[1]), id, f(b[3]), f(b[0]), T, E, K, norm);
                   ops::moe_router_stats(dev, s, f(b[4]), f(b[5]), f(b[1]), id, T, E, K);
                   ops::moe_aux_loss(dev, s, f(b[6]), f(b[7]), f(b[4]), f(b[5]), E, T, 0.01f);
                   ops::moe_router_backward(dev, s, f(b[9]), f(b[8]), f(b[1]), id, f(b[7]), T, E, K, norm);
                   const std::vector<float> raw = testing::download(dev, b[2], tk);
                   ids[static_cast<std::size_t>(which)].resize(tk);
                   std::memcpy(ids[static_cast<std::size_t>(which)].data(), raw.data(), tk * sizeof(std::int32_t));
                   ++which;
                 }, 1e-5f, norm ? "router, renormalized" : "router");
    EXPECT_EQ(ids[1], ids[0]);
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
