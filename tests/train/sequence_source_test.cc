// The random-ids source (train/sequence_source.h): every token scored, the targets the
// inputs shifted by one, ids over the whole vocabulary, sequences that depend on the seed
// and the number only, and evaluation sequences apart from the training ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/train/sequence_source.h"

namespace peakbound {
namespace {

TEST(RandomIdsSource, EveryTokenScoredTheNextIdTheTarget) {
  const std::int64_t V = 37, S = 50;
  auto src = random_ids_source(V, S, 5);
  EXPECT_EQ(src->seq_len(), S);
  EXPECT_DOUBLE_EQ(src->blind_loss(), std::log(37.0));
  std::vector<std::int32_t> in(S), tg(S), in2(S), tg2(S);
  std::set<std::int32_t> seen;
  for (std::int64_t n = 0; n < 40; ++n) {
    src->train(n, in.data(), tg.data());
    for (std::int64_t t = 0; t < S; ++t) {
      ASSERT_GE(in[t], 0);
      ASSERT_LT(in[t], V);
      ASSERT_GE(tg[t], 0);  // never ignore_index
      ASSERT_LT(tg[t], V);
      if (t + 1 < S) {
        ASSERT_EQ(tg[t], in[t + 1]);
      }
      seen.insert(in[t]);
    }
    random_ids_source(V, S, 5)->train(n, in2.data(), tg2.data());  // the seed and n alone
    EXPECT_EQ(in, in2);
    EXPECT_EQ(tg, tg2);
  }
  EXPECT_EQ(seen.size(), 37u);  // 2 000 draws reach every id of 37
  src->train(0, in.data(), tg.data());
  random_ids_source(V, S, 6)->train(0, in2.data(), tg2.data());
  EXPECT_NE(in, in2);  // another seed, another sequence
  src->eval(0, in2.data(), tg2.data());
  EXPECT_NE(in, in2);  // evaluation is not training sequence 0
  EXPECT_THROW(random_ids_source(0, S, 1), InvalidArgument);
}

}  // namespace
}  // namespace peakbound
