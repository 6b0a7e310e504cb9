// The benches' and checks' per-rank inputs on the device (MoeRankOnDevice,
// VocabRankOnDevice): what bytes() says they hold is what the Arena measures, so the
// automatic budgets that add it are exact, including ranks without tokens.
#include <gtest/gtest.h>

#include <string>

#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/verify/moe_reference.h"
#include "peakbound/verify/vocab_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(RankOnDevice, MoeSliceHoldsWhatBytesSays) {
  for (int ranks : {1, 2, 4})
    for (std::int64_t tokens : {0, 1, 37}) {
      MoeProblemSpec sp;
      sp.shape = MoeShape{24, 40, 8, 2};
      sp.ranks = ranks;
      sp.tokens = tokens;
      sp.skew = Skew::source;  // one rank 8x the tokens, one with none
      const MoeProblem p = make_moe_problem(sp);
      for (int r = 0; r < ranks; ++r) {
        SCOPED_TRACE("ranks " + std::to_string(ranks) + " tokens " + std::to_string(tokens) + " rank " +
                     std::to_string(r));
        CpuDevice dev(64ull << 20);
        MoeRankOnDevice on(dev, p, r, ranks);
        EXPECT_EQ(dev.arena().live(), MoeRankOnDevice::bytes(p, r, ranks));
      }
    }
}

TEST(RankOnDevice, VocabSliceHoldsWhatBytesSays) {
  for (std::int64_t tokens : {0, 1, 129})
    for (std::int64_t rows : {1, 333})
      for (Precision p : {Precision::f32, Precision::bf16}) {
        SCOPED_TRACE("tokens " + std::to_string(tokens) + " rows " + std::to_string(rows) + " " +
                     std::string(precision_name(p)));
        const std::int64_t H = 24;
        // 1 + 2^-10 rounds to 1 in bf16: the bf16 slice holds the rounded weight.
        std::vector<float> hidden(static_cast<std::size_t>(tokens * H), 1.0f),
            weight(static_cast<std::size_t>(rows * H), 1.0f + 1.0f / 1024);
        std::vector<std::int32_t> targets(static_cast<std::size_t>(tokens), 3);
        CpuDevice dev(64ull << 20);
        VocabRankOnDevice on(dev, hidden.data(), targets.data(), tokens, H, weight.data(), rows, p);
        EXPECT_EQ(dev.arena().live(), VocabRankOnDevice::bytes(tokens, H, rows, p));
        if (p == Precision::f32) {
          std::vector<float> back(weight.size());
          copy_to_host(dev, back.data(), on.weight.data(), back.size() * 4);
          EXPECT_EQ(back, weight);
        } else {
          std::vector<bf16> back(weight.size());
          copy_to_host(dev, back.data(), on.weight.data(), back.size() * sizeof(bf16));
          for (const bf16 x : back) ASSERT_EQ(to_f32(x), 1.0f);
        }
        // d_hidden read back as floats: what was written there, widened under bf16.
        const std::int64_t n = tokens * H;
        if (p == Precision::f32) {
          copy_to_device(dev, on.d_hidden.data(), hidden.data(), hidden.size() * 4);
        } else {
          std::vector<bf16> low(hidden.size(), to_bf16(1.0f));
          copy_to_device(dev, on.d_hidden.data(), low.data(), low.size() * sizeof(bf16));
        }
        EXPECT_EQ(on.d_hidden_floats(dev, n), hidden);
      }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
