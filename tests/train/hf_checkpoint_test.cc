// Loading the transformers fixtures into a ParameterStore: every value bitwise equal to
// the file's, expert-parallel ranks holding exactly their experts, the reference
// gradients matching store entries by name and shape; BF16 conversion and sharded
// (index.json) checkpoints; broken directories as one-line InvalidArguments. Writing one
// (HfModelWriter, export's): f32 bitwise, bf16 bitwise to_bf16 of the f32 values, headers
// and config.json's dtype saying what was written, the bf16 directory loading back rounded.
#include "peakbound/train/hf_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/train/gpt_oss_experts.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;

constexpr std::uint64_t MiB = 1024 * 1024;
const std::string kFixtures = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/";
const char* const kFamilies[] = {"qwen3_moe", "mixtral"};

TEST(HfCheckpoint, LoadsTheFixturesBitwiseAtEveryExpertParallelRank) {
  for (const char* family : kFamilies) {
    const std::string dir = kFixtures + family;
    const SafeTensorsFile file = SafeTensorsFile::open(dir + "/model.safetensors");
    for (std::int64_t ep : {1, 4}) {
      for (std::int64_t r = 0; r < ep; ++r) {
        CpuDevice dev(16 * MiB);
        const HfModel m = load_hf_model(dev, dir, ep, r);
        EXPECT_EQ(m.config.num_experts, 8);
        std::size_t held = 0;
        std::set<std::int64_t> experts;
        for (const SafeTensorInfo& t : file.tensors()) {
          // Which expert a per-expert tensor is, from its name alone (not the table).
          const std::string key = ".experts.";
          const std::size_t at = t.name.find(key);
          const std::int64_t e = at == std::string::npos ? -1 : std::stoll(t.name.substr(at + key.size()));
          const bool mine = e < 0 || e / (8 / ep) == r;
          ASSERT_EQ(m.store.contains(t.name), mine) << family << " ep " << ep << " rank " << r << " " << t.name;
          if (!mine) continue;
          ++held;
          if (e >= 0) experts.insert(e);
          EXPECT_EQ(m.store.shape(t.name), t.shape) << t.name;
          ASSERT_EQ(t.dtype, "F32");
          const auto bytes = file.bytes(t.name);
          ASSERT_EQ(bytes.size(), static_cast<std::size_t>(m.store.view(t.name).numel()) * sizeof(float));
          EXPECT_EQ(std::memcmp(m.store.param(t.name), bytes.data(), bytes.size()), 0) << family << " " << t.name;
        }
        EXPECT_EQ(held, m.store.size()) << family;
        const std::set<std::int64_t> want =
            ep == 1 ? std::set<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7} : std::set<std::int64_t>{2 * r, 2 * r + 1};
        EXPECT_EQ(experts, want) << family << " ep " << ep << " rank " << r;
        // Gradients start at zero.
        for (std::uint64_t i = 0; i < m.store.elements(); ++i) ASSERT_EQ(m.store.grads_data()[i], 0.0f);
      }
    }
  }
}

// gpt-oss's checkpoint experts, fused (the gpt_oss fixture: f32) and MXFP4 (gpt_oss_mxfp4:
// `_blocks` / `_scales` as the hub's), read into the trainer's packed rows: every expert row
// equals gpt_oss_pack_expert of the checkpoint's (or transformers' dequantized) tensors,
// bit for bit, and every other tensor is the file's.
TEST(HfCheckpoint, GptOssExpertsLoadIntoThePackedRowsFusedAndMxfp4) {
  for (const char* family : {"gpt_oss", "gpt_oss_mxfp4"}) {
    SCOPED_TRACE(family);
    const std::string dir = kFixtures + family;
    const bool mx = std::string(family) == "gpt_oss_mxfp4";
    const ModelConfig c = load_hf_config(dir);
    const SafeTensorsFile file = SafeTensorsFile::open(dir + "/model.safetensors");
    const SafeTensorsFile deq = mx ? SafeTensorsFile::open(dir + "/dequantized.safetensors") : file;
    const TensorTable table(c, TableLayout::trainer);
    ASSERT_TRUE(table.converts_experts());
    const std::int64_t H = c.hidden_size, F = c.moe_intermediate_size, EF = gpt_oss_expert_floats(H, F);
    std::int64_t experts_seen = 0, others = 0;
    const ShardSelector all = [](const TensorEntry& e) -> std::optional<RowRange> {
      return RowRange{0, e.shape.empty() ? 1 : e.shape[0]};
    };
    for_each_hf_tensor(dir, table, all, [&](const ParameterView& v, const float* x, std::uint64_t n) {
      ASSERT_EQ(n, static_cast<std::uint64_t>(v.numel()));
      if (v.entry.kind != TensorKind::expert) {
        const std::vector<float> want = file.read_f32(v.name());
        EXPECT_EQ(std::memcmp(x, want.data(), n * sizeof(float)), 0) << v.name();
        ++others;
        return;
      }
      const std::string p = "model.layers." + std::to_string(v.entry.layer) + ".mlp.experts.";
      const std::int64_t e = v.entry.expert;
      const std::vector<float> gu = deq.read_f32(p + "gate_up_proj"), d = deq.read_f32(p + "down_proj");
      const std::vector<float> gub = file.read_f32(p + "gate_up_proj_bias"), db = file.read_f32(p + "down_proj_bias");
      std::vector<float> packed(static_cast<std::size_t>(EF));
      gpt_oss_pack_expert(packed.data(), gu.data() + e * H * 2 * F, gub.data() + e * 2 * F, d.data() + e * F * H,
                          db.data() + e * H, H, F);
      const float* want = packed.data() + gpt_oss_piece_offset(v.name(), H, F);
      EXPECT_EQ(std::memcmp(x, want, n * sizeof(float)), 0) << v.name();
      ++experts_seen;
    });
    EXPECT_EQ(experts_seen, 6 * c.num_experts * c.num_layers);
    EXPECT_GT(others, 0);
  }
}

TEST(HfCheckpoint, ReferenceGradientsMatchStoreEntriesByNameAndShape) {
  for (const char* family : kFamilies) {
    CpuDevice dev(16 * MiB);
    const HfModel m = load_hf_model(dev, kFixtures + family);
    const SafeTensorsFile ref = SafeTensorsFile::open(kFixtures + family + "/reference.safetensors");
    std::size_t grads = 0;
    for (const SafeTensorInfo& t : ref.tensors()) {
      if (t.name.rfind("grad.", 0) != 0) continue;
      ++grads;
      const std::string name = t.name.substr(5);
      ASSERT_TRUE(m.store.contains(name)) << family << " " << t.name;
      EXPECT_EQ(m.store.shape(name), t.shape) << family << " " << t.name;
    }
    EXPECT_EQ(grads, m.store.size()) << family;  // and every store entry has one
  }
}

// A writable copy of a fixture, with its tensors editable before writing.
class HfCheckpointDir : public ::testing::Test {
 protected:
  struct Tensor {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> data;
  };

  void SetUp() override {
    static int n = 0;
    dir_ = ::testing::TempDir() + "/pb_hfck_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
    fs::create_directories(dir_);
    fs::copy_file(kFixtures + "qwen3_moe/config.json", dir_ + "/config.json");
    const SafeTensorsFile f = SafeTensorsFile::open(kFixtures + "qwen3_moe/model.safetensors");
    for (const SafeTensorInfo& t : f.tensors()) {
      const auto b = f.bytes(t.name);
      tensors_.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  Tensor* find(const std::string& name) {
    for (Tensor& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  void erase(const std::string& name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
  }
  void write(const std::string& file, const std::function<bool(const Tensor&)>& keep = nullptr) {
    std::vector<SafeTensorOut> out;
    for (const Tensor& t : tensors_)
      if (!keep || keep(t)) out.push_back({t.name, t.dtype, t.shape, t.data.data(), t.data.size()});
    write_safetensors(dir_ + "/" + file, out);
  }
  // The InvalidArgument's message from loading the directory ("no error" if it loads).
  std::string load_error() {
    try {
      CpuDevice dev(16 * MiB);
      load_hf_model(dev, dir_);
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      return m;
    }
    return "no error";
  }

  std::string dir_;
  std::vector<Tensor> tensors_;
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(HfCheckpointDir, AnUnmodifiedCopyLoads) {
  write("model.safetensors");
  EXPECT_EQ(load_error(), "no error");
}

TEST_F(HfCheckpointDir, MissingTensorIsNamed) {
  erase("model.layers.1.self_attn.q_proj.weight");
  write("model.safetensors");
  const std::string m = load_error();
  EXPECT_HAS(m, dir_ + "/model.safetensors: missing tensor 'model.layers.1.self_attn.q_proj.weight' [32, 32]");
}

TEST_F(HfCheckpointDir, WrongShapeIsNamed) {
  Tensor* t = find("model.norm.weight");
  t->shape = {31};
  t->data.resize(31 * 4);
  write("model.safetensors");
  EXPECT_HAS(load_error(), "model.safetensors: tensor 'model.norm.weight' has shape [31], config.json implies [32]");
}

TEST_F(HfCheckpointDir, UnknownTensorIsAnErrorButRotaryInvFreqIsIgnored) {
  Tensor extra = *find("model.layers.0.mlp.experts.7.up_proj.weight");
  extra.name = "model.layers.0.mlp.experts.8.up_proj.weight";  // a ninth expert the config lacks
  tensors_.push_back(extra);
  write("model.safetensors");
  EXPECT_HAS(load_error(), "model.safetensors: unknown tensor 'model.layers.0.mlp.experts.8.up_proj.weight' [16, 32]");

  erase(extra.name);
  std::vector<float> inv(4, 0.5f);
  Tensor rotary{"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4}, {}};
  rotary.data.resize(16);
  std::memcpy(rotary.data.data(), inv.data(), 16);
  tensors_.push_back(rotary);
  write("model.safetensors");
  EXPECT_EQ(load_error(), "no error");
}

TEST_F(HfCheckpointDir, MissingConfigOrWeightsIsNamed) {
  write("model.safetensors");
  fs::remove(dir_ + "/config.json");
  EXPECT_HAS(load_error(), "no config.json");
  fs::copy_file(kFixtures + "qwen3_moe/config.json", dir_ + "/config.json");
  fs::remove(dir_ + "/model.safetensors");
  EXPECT_HAS(load_error(), "has no model.safetensors and no model.safetensors.index.json");
}

TEST_F(HfCheckpointDir, IntegerWeightsAreRefused) {
  Tensor* t = find("model.norm.weight");
  t->dtype = "I32";
  write("model.safetensors");
  EXPECT_HAS(load_error(), "tensor 'model.norm.weight' is I32; weights must be F32, BF16, F16 or F64");
}

TEST_F(HfCheckpointDir, Bf16IsWidenedExactly) {
  // Every tensor as BF16 (the top 16 bits of each f32): widening back is exact.
  for (Tensor& t : tensors_) {
    std::vector<std::byte> half(t.data.size() / 2);
    for (std::size_t i = 0; i < half.size() / 2; ++i) std::memcpy(&half[2 * i], &t.data[4 * i + 2], 2);
    t.data = std::move(half);
    t.dtype = "BF16";
  }
  write("model.safetensors");
  CpuDevice dev(16 * MiB);
  const HfModel m = load_hf_model(dev, dir_, 4, 3);
  for (const Tensor& t : tensors_) {
    if (!m.store.contains(t.name)) continue;
    const float* p = m.store.param(t.name);
    for (std::size_t i = 0; i < t.data.size() / 2; ++i) {
      std::uint32_t bits = 0;
      std::uint16_t hi = 0;
      std::memcpy(&hi, &t.data[2 * i], 2);
      std::memcpy(&bits, &p[i], 4);
      ASSERT_EQ(bits, static_cast<std::uint32_t>(hi) << 16) << t.name << "[" << i << "]";
    }
  }
}

TEST_F(HfCheckpointDir, ShardedCheckpointsFollowTheIndex) {
  // Two shards split by layer, as save_pretrained(max_shard_size=...) writes them.
  auto in_first = [](const Tensor& t) { return t.name.find("layers.1.") == std::string::npos; };
  write("model-00001-of-00002.safetensors", in_first);
  write("model-00002-of-00002.safetensors", [&](const Tensor& t) { return !in_first(t); });
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const Tensor& t : tensors_)
    index["weight_map"][t.name] = in_first(t) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  std::ofstream(dir_ + "/model.safetensors.index.json") << index.dump();
  // A stray model.safetensors beside the index is not read: the index names the files.
  std::vector<float> junk(2);
  write_safetensors(dir_ + "/model.safetensors", {{"junk", "F32", {2}, junk.data(), 8}});
  EXPECT_EQ(hf_weight_files(dir_).size(), 2u);
  CpuDevice dev(16 * MiB);
  const HfModel m = load_hf_model(dev, dir_);
  EXPECT_EQ(m.store.size(), tensors_.size());
  for (const Tensor& t : tensors_)
    EXPECT_EQ(std::memcmp(m.store.param(t.name), t.data.data(), t.data.size()), 0) << t.name;

  // A tensor in both shards is ambiguous; an index naming a file outside the folder is refused.
  write("model-00002-of-00002.safetensors", [&](const Tensor& t) { return !in_first(t) || t.name == "lm_head.weight"; });
  EXPECT_HAS(load_error(), "tensor 'lm_head.weight' is also in");
  index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors";
  std::ofstream(dir_ + "/model.safetensors.index.json") << index.dump();
  EXPECT_HAS(load_error(), "not a file inside the model directory");
}

// A NaN or infinity in the weights is refused at load, on the host copy, naming the
// tensor, the file and the element (before, step 1 blamed the embedding and advised a lower
// --lr). F32 is read from the mapping, BF16 through its widened copy: both are checked.
TEST_F(HfCheckpointDir, NonFiniteWeightsAreNamedWithFileAndElement) {
  Tensor* gate = find("model.layers.0.mlp.gate.weight");
  ASSERT_NE(gate, nullptr);
  ASSERT_EQ(gate->dtype, "F32");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&gate->data[17 * 4], &nan, 4);
  write("model.safetensors");
  EXPECT_EQ(load_error(), "model.layers.0.mlp.gate.weight in " + dir_ +
                              "/model.safetensors holds NaN at element 17: the weights are corrupt (re-download, "
                              "re-export or pick another checkpoint)");
  // An infinity in an expert's tensor of a BF16 checkpoint, held by expert-parallel rank 3 only.
  const float finite = 0.5f;
  std::memcpy(&gate->data[17 * 4], &finite, 4);
  for (Tensor& t : tensors_) {
    std::vector<std::byte> half(t.data.size() / 2);
    for (std::size_t i = 0; i < half.size() / 2; ++i) std::memcpy(&half[2 * i], &t.data[4 * i + 2], 2);
    t.data = std::move(half);
    t.dtype = "BF16";
  }
  Tensor* up = find("model.layers.1.mlp.experts.7.up_proj.weight");
  ASSERT_NE(up, nullptr);
  const std::uint16_t neg_inf = 0xff80;
  std::memcpy(&up->data[2 * 5], &neg_inf, 2);
  write("model.safetensors");
  EXPECT_HAS(load_error(), "model.layers.1.mlp.experts.7.up_proj.weight in " + dir_ +
                               "/model.safetensors holds -inf at element 5");
  CpuDevice dev(16 * MiB);
  EXPECT_NO_THROW(load_hf_model(dev, dir_, 4, 0));  // rank 0 holds experts 0 and 1 only
  EXPECT_THROW(load_hf_model(dev, dir_, 4, 3), InvalidArgument);
}

// --- Writing a model directory (export) in f32 and bf16 ---

TEST(HfConfigDtype, ReadsDtypeThenTorchDtypeAndDefaultsToF32) {
  using nlohmann::json;
  EXPECT_EQ(hf_config_dtype(json{{"torch_dtype", "bfloat16"}}), DType::bf16);
  EXPECT_EQ(hf_config_dtype(json{{"dtype", "bfloat16"}}), DType::bf16);
  EXPECT_EQ(hf_config_dtype(json{{"torch_dtype", "torch.bfloat16"}}), DType::bf16);
  EXPECT_EQ(hf_config_dtype(json{{"dtype", "float32"}}), DType::f32);
  EXPECT_EQ(hf_config_dtype(json{{"torch_dtype", "float16"}}), DType::f32);  // no f16 export: f32 holds it exactly
  EXPECT_EQ(hf_config_dtype(json{{"model_type", "qwen3_moe"}}), DType::f32);
  EXPECT_EQ(hf_config_dtype(json{{"dtype", nullptr}, {"torch_dtype", "bfloat16"}}), DType::bf16);
  // "dtype" (transformers >= 4.56) wins over a stale "torch_dtype".
  EXPECT_EQ(hf_config_dtype(json{{"dtype", "float32"}, {"torch_dtype", "bfloat16"}}), DType::f32);
}

TEST(HfConfigDtype, ConfigTextSaysTheWrittenDtypeAndKeepsTheRest) {
  const std::string f32_text = "{\n  \"zeta\": 1,\n  \"dtype\": \"float32\",\n  \"alpha\": [1, 2]\n}\n";
  EXPECT_EQ(hf_config_text_for(f32_text, DType::f32, "c"), f32_text);  // already right: verbatim
  const nlohmann::ordered_json bf = nlohmann::ordered_json::parse(hf_config_text_for(f32_text, DType::bf16, "c"));
  EXPECT_EQ(bf["dtype"], "bfloat16");
  EXPECT_FALSE(bf.contains("torch_dtype"));
  std::vector<std::string> keys;
  for (const auto& [k, v] : bf.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "dtype", "alpha"}));  // the source's order
  EXPECT_EQ(bf["alpha"], nlohmann::ordered_json::parse("[1, 2]"));
  // Both fields set where both are present; torch_dtype added where neither is.
  const auto both = nlohmann::json::parse(
      hf_config_text_for(R"({"torch_dtype": "bfloat16", "dtype": "float32"})", DType::bf16, "c"));
  EXPECT_EQ(both["torch_dtype"], "bfloat16");
  EXPECT_EQ(both["dtype"], "bfloat16");
  const auto none = nlohmann::json::parse(hf_config_text_for(R"({"model_type": "x"})", DType::f32, "c"));
  EXPECT_EQ(none["torch_dtype"], "float32");
  EXPECT_FALSE(none.contains("dtype"));
  EXPECT_THROW(hf_config_text_for("[1]", DType::f32, "c"), InvalidArgument);
  EXPECT_THROW(HfModelWriter(DType::f64), InvalidArgument);
}

TEST(HfModelWriter, AValueBeyondBf16sRangeIsRefusedNamingIt) {
  const float big = bits_float(0x7f7f8000u);  // finite in f32, a tie above bf16's largest: rounds to inf
  const float top = bits_float(0x7f7f7fffu);  // below the tie: rounds to bf16's largest, 0x7f7f
  std::vector<float> v = {1.0f, -top, top, -big};
  HfModelWriter f32(DType::f32);
  EXPECT_NO_THROW(f32.add("w", {4}, v));
  HfModelWriter bf(DType::bf16);
  try {
    bf.add("w", {4}, v);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "tensor 'w' element 3 (");
    EXPECT_HAS(m, "is not finite in bf16");
    EXPECT_HAS(m, "--dtype f32");
  }
  v.pop_back();
  EXPECT_NO_THROW(bf.add("w", {3}, v));
}

// The fixture's tensors (plus rounding cases put into model.norm.weight: ties to even both
// ways, a value that carries into the exponent, negatives, a subnormal, zero and -0)
// written in f32 and in bf16.
TEST_F(HfCheckpointDir, WriterWritesF32AndBf16RoundedToNearestEven) {
  Tensor* norm = find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  const std::uint32_t cases[] = {0x3f808000u,  // 1 + 2^-8: a tie, rounds down to even 0x3f80
                                 0x3f818000u,  // a tie that rounds up to even 0x3f82
                                 0x3f808001u,  // just above a tie: up
                                 0x3f7fffffu,  // carries into the exponent: 0x3f80
                                 0xbf818000u,  // negative tie: 0xbf82
                                 0x00012345u,  // subnormal
                                 0x00000000u, 0x80000000u};
  for (std::size_t i = 0; i < std::size(cases); ++i) std::memcpy(&norm->data[4 * i], &cases[i], 4);
  std::ifstream in(kFixtures + "qwen3_moe/config.json");
  std::stringstream config;
  config << in.rdbuf();
  for (DType dtype : {DType::f32, DType::bf16}) {
    HfModelWriter w(dtype);
    for (const Tensor& t : tensors_) {
      std::vector<float> v(t.data.size() / 4);
      std::memcpy(v.data(), t.data.data(), t.data.size());
      w.add(t.name, t.shape, v);
    }
    const std::string out = dir_ + "/" + std::string(dtype_name(dtype));
    w.write(out, config.str());
    const bool bf = dtype == DType::bf16;
    // config.json names the dtype written; the rest is the source's.
    std::ifstream cin(out + "/config.json");
    const nlohmann::json written = nlohmann::json::parse(cin);
    nlohmann::json want = nlohmann::json::parse(config.str());
    want["dtype"] = bf ? "bfloat16" : "float32";
    EXPECT_EQ(written, want);
    EXPECT_EQ(hf_config_dtype(written), dtype);
    const SafeTensorsFile f = SafeTensorsFile::open(out + "/model.safetensors");
    EXPECT_EQ(f.metadata().at("format"), "pt");
    ASSERT_EQ(f.tensors().size(), tensors_.size());
    for (const Tensor& t : tensors_) {
      const SafeTensorInfo& info = f.info(t.name);
      EXPECT_EQ(info.dtype, bf ? "BF16" : "F32") << t.name;
      EXPECT_EQ(info.shape, t.shape) << t.name;
      const auto bytes = f.bytes(t.name);
      if (!bf) {
        ASSERT_EQ(bytes.size(), t.data.size());
        EXPECT_EQ(std::memcmp(bytes.data(), t.data.data(), bytes.size()), 0) << t.name;
        continue;
      }
      ASSERT_EQ(bytes.size(), t.data.size() / 2);
      for (std::size_t i = 0; i < bytes.size() / 2; ++i) {
        float x;
        std::uint16_t got;
        std::memcpy(&x, &t.data[4 * i], 4);
        std::memcpy(&got, &bytes[2 * i], 2);
        ASSERT_EQ(got, to_bf16(x).bits) << t.name << "[" << i << "]";
      }
    }
    if (bf) {  // the rounding cases, by hand (to_bf16 is the reference above)
      const std::uint16_t want_bits[] = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0x0001, 0x0000, 0x8000};
      const auto bytes = f.bytes("model.norm.weight");
      for (std::size_t i = 0; i < std::size(want_bits); ++i) {
        std::uint16_t got;
        std::memcpy(&got, &bytes[2 * i], 2);
        EXPECT_EQ(got, want_bits[i]) << i;
      }
    }
    // Loading the directory back gives the written values: f32 bitwise, bf16 widened.
    CpuDevice dev(16 * MiB);
    const HfModel m = load_hf_model(dev, out);
    for (const Tensor& t : tensors_) {
      const float* p = m.store.param(t.name);
      for (std::size_t i = 0; i < t.data.size() / 4; ++i) {
        float x;
        std::memcpy(&x, &t.data[4 * i], 4);
        const float want_x = bf ? to_f32(to_bf16(x)) : x;
        ASSERT_EQ(float_bits(p[i]), float_bits(want_x)) << t.name << "[" << i << "]";
      }
    }
  }
}

TEST(HfCheckpointFinite, CheckFiniteWeightsFindsTheFirstBadElementAnywhere) {
  std::vector<float> v(10000, 1.0f);
  EXPECT_NO_THROW(check_finite_weights(v.data(), v.size(), "t", "f"));
  v[9999] = std::numeric_limits<float>::infinity();
  v[8191] = std::numeric_limits<float>::quiet_NaN();
  try {
    check_finite_weights(v.data() + 100, v.size() - 100, "t", "f", 100);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(std::string(e.what()), "t in f holds NaN at element 8191:");
  }
  v[8191] = std::numeric_limits<float>::max();  // large but finite
  EXPECT_THROW(check_finite_weights(v.data(), v.size(), "t", "f"), InvalidArgument);  // the +inf
  EXPECT_NO_THROW(check_finite_weights(v.data(), 9999, "t", "f"));
}

// --- The host-side callback loader (for_each_hf_tensor) and bf16 stores ---

// for_each_hf_tensor hands out exactly what load_hf_weights uploads: the same tensors in
// the same order, the same rows, the same f32 bits, at every expert-parallel rank.
TEST(HfCheckpoint, ForEachTensorReproducesLoadHfWeightsBitwise) {
  for (const char* family : kFamilies) {
    const std::string dir = kFixtures + family;
    for (std::int64_t ep : {1, 4}) {
      for (std::int64_t r = 0; r < ep; ++r) {
        CpuDevice dev(16 * MiB);
        const HfModel m = load_hf_model(dev, dir, ep, r);
        std::size_t i = 0;
        for_each_hf_tensor(dir, m.table, expert_parallel(m.table, ep, r),
                           [&](const ParameterView& v, const float* values, std::uint64_t n) {
                             ASSERT_LT(i, m.store.size());
                             const ParameterView& want = m.store.views()[i++];
                             ASSERT_EQ(v.name(), want.name());
                             EXPECT_EQ(v.rows.begin, want.rows.begin) << v.name();
                             EXPECT_EQ(v.rows.end, want.rows.end) << v.name();
                             EXPECT_EQ(v.shape, want.shape) << v.name();
                             ASSERT_EQ(n, static_cast<std::uint64_t>(want.numel())) << v.name();
                             EXPECT_EQ(std::memcmp(values, m.store.param(want), n * sizeof(float)), 0)
                                 << family << " ep " << ep << " rank " << r << " " << v.name();
                           });
        EXPECT_EQ(i, m.store.size()) << family << " ep " << ep << " rank " << r;
      }
    }
  }
}

// A bf16 store loads to_bf16 of the f32 values (round to nearest even, on the host), every
// element bitwise; its padding stays zero and its gradients f32 zeros.
TEST(HfCheckpoint, Bf16StoreLoadsTheValuesRoundedToNearestEven) {
  for (const char* family : kFamilies) {
    const std::string dir = kFixtures + family;
    CpuDevice dev(32 * MiB);
    const HfModel m = load_hf_model(dev, dir, 4, 1);
    ParameterStore b(dev, m.table, expert_parallel(m.table, 4, 1), {}, Precision::bf16);
    load_hf_weights(dir, b);
    ASSERT_EQ(b.size(), m.store.size());
    std::vector<bool> covered(b.elements(), false);
    std::size_t rounded = 0;
    for (const ParameterView& v : b) {
      const float* want = m.store.param(v.name());
      const bf16* got = b.param_as<bf16>(v);
      for (std::int64_t k = 0; k < v.numel(); ++k) {
        ASSERT_EQ(got[k].bits, to_bf16(want[k]).bits) << family << " " << v.name() << "[" << k << "]";
        rounded += to_f32(got[k]) != want[k];
        covered[v.offset + static_cast<std::uint64_t>(k)] = true;
      }
    }
    EXPECT_GT(rounded, 0u) << family;  // the fixture's values are not all bf16 already
    const auto* all = static_cast<const bf16*>(b.params_raw());
    for (std::uint64_t k = 0; k < b.elements(); ++k) {
      if (!covered[k]) {
        ASSERT_EQ(all[k].bits, 0u) << "padding element " << k;
      }
      ASSERT_EQ(b.grads_data()[k], 0.0f) << k;
    }
  }
}

// The checkpoint is checked whole before any callback; BF16 files are widened exactly; a
// selector's row range (here rows [3, 7) of the embedding) reaches fn as those rows.
TEST_F(HfCheckpointDir, ForEachTensorChecksFirstAndReadsBf16Rows) {
  for (Tensor& t : tensors_) {
    std::vector<std::byte> half(t.data.size() / 2);
    for (std::size_t i = 0; i < half.size() / 2; ++i) std::memcpy(&half[2 * i], &t.data[4 * i + 2], 2);
    t.data = std::move(half);
    t.dtype = "BF16";
  }
  const TensorTable table(load_hf_config(kFixtures + "qwen3_moe"));
  const std::string embed = "model.embed_tokens.weight";
  const ShardSelector rows = [&](const TensorEntry& e) -> std::optional<RowRange> {
    if (e.name == embed) return RowRange{3, 7};
    return std::nullopt;
  };
  const Tensor* e = find(embed);
  ASSERT_NE(e, nullptr);
  const std::int64_t H = e->shape[1];
  int calls = 0;
  write("model.safetensors", [](const Tensor& t) { return t.name != "model.norm.weight"; });
  EXPECT_THROW(for_each_hf_tensor(dir_, table, rows, [&](const ParameterView&, const float*, std::uint64_t) { ++calls; }),
               InvalidArgument);
  EXPECT_EQ(calls, 0);  // the embedding comes first in the file, but nothing was handed out
  write("model.safetensors");
  for_each_hf_tensor(dir_, table, rows, [&](const ParameterView& v, const float* values, std::uint64_t n) {
    ++calls;
    ASSERT_EQ(v.name(), embed);
    ASSERT_EQ(n, static_cast<std::uint64_t>(4 * H));
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint16_t hi = 0;
      std::memcpy(&hi, &e->data[2 * (3 * static_cast<std::uint64_t>(H) + i)], 2);
      ASSERT_EQ(float_bits(values[i]), static_cast<std::uint32_t>(hi) << 16) << i;
    }
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

#undef EXPECT_HAS
