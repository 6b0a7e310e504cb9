// SafeTensors: the Hugging Face reference fixtures read as transformers wrote them; a
// write/read round trip; every malformed file a one-line InvalidArgument naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/safetensors.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

const std::string kFixtures = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/";

TEST(SafeTensors, ReadsTheTransformersFixtures) {
  for (const char* family : {"qwen3_moe", "mixtral"}) {
    SafeTensorsFile m = SafeTensorsFile::open(kFixtures + family + "/model.safetensors");
    const SafeTensorInfo& e = m.info("model.embed_tokens.weight");
    EXPECT_EQ(e.dtype, "F32");
    EXPECT_EQ(e.shape, (std::vector<std::int64_t>{256, 32}));
    EXPECT_EQ(m.read_f32("lm_head.weight").size(), 256u * 32u);
    // Experts are saved one tensor per expert, as hub checkpoints are.
    const std::string expert = std::string(family) == "mixtral"
                                   ? "model.layers.1.block_sparse_moe.experts.7.w2.weight"
                                   : "model.layers.1.mlp.experts.7.down_proj.weight";
    EXPECT_EQ(m.info(expert).shape, (std::vector<std::int64_t>{32, 16})) << family;

    SafeTensorsFile r = SafeTensorsFile::open(kFixtures + family + "/reference.safetensors");
    const auto ids = r.read_i64("input_ids");
    ASSERT_EQ(ids.size(), 32u);
    for (std::int64_t t : ids) EXPECT_TRUE(t >= 0 && t < 256);
    const float loss = r.read_f32("loss")[0], ce = r.read_f32("ce_loss")[0], aux = r.read_f32("aux_loss")[0];
    EXPECT_NEAR(loss, ce + 0.01f * aux, 1e-5f * loss) << family;  // loss = ce + router_aux_loss_coef * aux
    // Every parameter has its gradient.
    for (const SafeTensorInfo& t : m.tensors()) {
      ASSERT_TRUE(r.contains("grad." + t.name)) << t.name;
      EXPECT_EQ(r.info("grad." + t.name).shape, t.shape) << t.name;
    }
    // The reference's fp64 recomputation agrees with the stored fp32 loss.
    const auto j = nlohmann::json::parse(std::ifstream(kFixtures + family + "/reference.json"));
    EXPECT_NEAR(loss, j["loss_fp64"].get<double>(), 1e-5 * loss) << family;
  }
}

class SafeTensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::testing::TempDir() + "/pb_st_" + std::to_string(::getpid()) + "_"; }
  std::string write_raw(const std::string& name, const std::string& header, std::size_t data_bytes) {
    const std::string p = dir_ + name;
    std::ofstream f(p, std::ios::binary);
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header << std::string(data_bytes, '\0');
    return p;
  }
  std::string dir_;
};

TEST_F(SafeTensorsFiles, RoundTripIsExactAndAtomic) {
  const std::string p = dir_ + "rt.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  std::vector<std::int64_t> b = {7, -9};
  write_safetensors(p, {{"a", "F32", {2, 3}, a.data(), a.size() * 4}, {"b", "I64", {2}, b.data(), 16}}, {{"step", "3"}});
  SafeTensorsFile f = SafeTensorsFile::open(p);
  EXPECT_EQ(f.read_f32("a"), a);
  EXPECT_EQ(f.read_i64("b"), b);
  EXPECT_EQ(f.metadata().at("step"), "3");
  EXPECT_EQ(f.info("a").shape, (std::vector<std::int64_t>{2, 3}));
  // Overwriting replaces it whole; no temporary file is left beside it.
  std::vector<float> c = {4.0f};
  write_safetensors(p, {{"c", "F32", {1}, c.data(), 4}});
  SafeTensorsFile g = SafeTensorsFile::open(p);
  EXPECT_FALSE(g.contains("a"));
  EXPECT_EQ(g.read_f32("c"), c);
  EXPECT_THROW(write_safetensors(p, {{"x", "F32", {2}, c.data(), 4}}), InvalidArgument);  // 4 bytes for 2 floats
  EXPECT_EQ(SafeTensorsFile::open(p).read_f32("c"), c);  // a refused write leaves the old file
}

TEST_F(SafeTensorsFiles, MalformedFilesAreOneLineErrorsNamingTheFile) {
  auto expect_bad = [](const std::string& path, const std::string& needle) {
    try {
      SafeTensorsFile::open(path);
      ADD_FAILURE() << "expected an error about " << needle;
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      EXPECT_EQ(w.rfind(path, 0), 0u) << w;
      EXPECT_NE(w.find(needle), std::string::npos) << w;
      EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    }
  };
  {
    std::ofstream(dir_ + "short") << "abc";
  }
  expect_bad(dir_ + "short", "too short");
  expect_bad(write_raw("json", "{not json", 0), "not valid JSON");
  expect_bad(write_raw("trunc", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "outside");
  expect_bad(write_raw("size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16), "elements");
  expect_bad(write_raw("dtype", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype");
  expect_bad(write_raw("neg", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "non-negative");
  expect_bad(write_raw("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
             "overlap");
  expect_bad(write_raw("huge", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4), "overflows");
  // Found writing tests/fuzz's checks of a successful read: a product past 2^63 that a
  // later zero brings back to 0 (numel() overflowed int64); an overlap hidden behind an
  // empty tensor; a tensor named twice (the JSON reader kept the second silently). And a
  // name holding a newline, as the fuzzer found elsewhere: the error is still one line.
  expect_bad(write_raw("wrap", R"({"a":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})", 0),
             "overflows");
  expect_bad(write_raw("hidden", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                 R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                 R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 16),
             "tensors 'a' and 'c' overlap");
  expect_bad(write_raw("twice", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
             "'a' is given twice");
  // Found by the fuzzer (UBSan): an empty F32 tensor was read with memcpy(nullptr, ..., 0).
  EXPECT_TRUE(SafeTensorsFile::open(write_raw("empty", R"({"e":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}})", 0))
                  .read_f32("e")
                  .empty());
  expect_bad(write_raw("newline", R"({"x\ny":{"dtype":"F32","shape":[1],"data_offsets":[0,5]}})", 8), "'x\\ny'");
  std::string p = write_raw("hdr", "{}", 0);
  {  // a header length far past the end
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.put(static_cast<char>(0xff));
  }
  expect_bad(p, "header length");
  expect_bad(dir_ + "missing", "cannot read");
  SafeTensorsFile ok = SafeTensorsFile::open(write_raw("ok", R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4));
  EXPECT_THROW(ok.read_f32("a"), InvalidArgument);
  EXPECT_THROW(ok.info("b"), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
