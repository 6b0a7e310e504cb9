// The synthetic long-context task: deterministic, scored only on retrievable values,
// each pair far back, values uniform (so the context-blind loss is their entropy).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "peakbound/core/error.h"
#include "peakbound/train/kv_retrieval_task.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(KvRetrievalTask, DeterministicAndDifferentPerIndex) {
  const KvRetrievalTask t = KvRetrievalTask::standard(512, 4096, 7);
  const auto a = t.sequence(3), b = t.sequence(3), c = t.sequence(4);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.inputs, c.inputs);
  KvRetrievalTask other = t;
  other.seed = 8;
  EXPECT_NE(other.sequence(3).inputs, a.inputs);
}

TEST(KvRetrievalTask, EveryScoredValueIsItsKeysStoredValueFarBack) {
  for (std::int64_t S : {16, 63, 1000, 4096}) {
    const KvRetrievalTask t = KvRetrievalTask::standard(300, S, 11);
    for (std::int64_t idx = 0; idx < 5; ++idx) {
      const auto s = t.sequence(idx);
      ASSERT_EQ(static_cast<std::int64_t>(s.inputs.size()), S);
      ASSERT_EQ(static_cast<std::int64_t>(s.targets.size()), S);
      EXPECT_GE(s.min_distance, S / 2) << S;
      // A perfect retriever: the value stored after this key at the start.
      std::map<std::int32_t, std::int32_t> store;
      for (std::int64_t i = 1; i + 1 < 1 + 2 * t.pairs; i += 2) store[s.inputs[i]] = s.inputs[i + 1];
      std::int64_t scored = 0;
      for (std::int64_t i = 0; i < S; ++i) {
        if (s.targets[i] == -100) continue;
        ++scored;
        ASSERT_GE(i, 1);
        EXPECT_EQ(s.inputs[i - 1], KvRetrievalTask::kQuery) << "query at " << i;
        EXPECT_EQ(s.targets[i], store.at(s.inputs[i])) << "query at " << i;
        EXPECT_GE(s.targets[i], t.first_value());
      }
      EXPECT_EQ(scored, t.queries);
      EXPECT_EQ(static_cast<std::int64_t>(store.size()), t.pairs);  // keys are distinct
    }
  }
}

TEST(KvRetrievalTask, ValuesAreUniformSoTheBlindLossIsTheirEntropy) {
  const KvRetrievalTask t = KvRetrievalTask::standard(40, 2048, 3);
  std::map<std::int32_t, std::int64_t> counts;
  std::int64_t total = 0;
  for (std::int64_t idx = 0; idx < 40; ++idx)
    for (std::int32_t v : t.sequence(idx).targets)
      if (v != -100) ++counts[v], ++total;
  double h = 0;
  for (auto [v, c] : counts) {
    const double p = static_cast<double>(c) / static_cast<double>(total);
    h -= p * std::log(p);
  }
  EXPECT_EQ(static_cast<std::int64_t>(counts.size()), t.values());
  EXPECT_NEAR(h, t.unigram_entropy(), 0.05);
}

TEST(KvRetrievalTask, ImpossibleShapesAreRefused) {
  KvRetrievalTask t = KvRetrievalTask::standard(512, 64, 1);
  t.pairs = 1000;
  EXPECT_THROW(t.validate(), InvalidArgument);
  EXPECT_THROW(KvRetrievalTask::standard(5, 64, 1).validate(), InvalidArgument);
  EXPECT_THROW(KvRetrievalTask::standard(512, 4, 1).validate(), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// With symbols set, keys and values come from two ranges of that many ids each, and the
// blind entropy is log(symbols) whatever the vocabulary.
TEST(KvRetrievalTask, SymbolsLimitKeysAndValues) {
  const KvRetrievalTask t = KvRetrievalTask::standard(16384, 256, 3, 64);
  EXPECT_EQ(t.keys(), 64);
  EXPECT_EQ(t.values(), 64);
  EXPECT_NEAR(t.unigram_entropy(), std::log(64.0), 1e-12);
  for (std::int64_t i = 0; i < 20; ++i) {
    const KvRetrievalTask::Sequence s = t.sequence(i);
    for (std::int32_t tok : s.inputs) {
      EXPECT_GE(tok, 0);
      EXPECT_LT(tok, KvRetrievalTask::kFirstKey + 128);
    }
    for (std::int32_t tok : s.targets)
      if (tok != -100) {
        EXPECT_GE(tok, t.first_value());
        EXPECT_LT(tok, t.first_value() + 64);
      }
  }
  KvRetrievalTask bad = t;
  bad.symbols = 9000;  // 2 + 18000 > 16384
  EXPECT_THROW(bad.validate(), InvalidArgument);
  bad.symbols = 1;
  EXPECT_THROW(bad.validate(), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
