// `peakbound train --model DIR` refuses a config.json that describes a model the trainer
// would compute differently (an activation other than SiLU, RoPE scaling), naming the
// field and its value, and a weight file holding a NaN, naming the tensor, file and element;
// `--config FIFO` is refused at once instead of blocking.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/io/safetensors.h"
#include "tests/cli/run_cli.h"

namespace peakbound::testing {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;
const std::string kFixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";

// A copy of the fixture with `edit` applied to its config.json.
std::string edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = ::testing::TempDir() + "/pb_unmodelled_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kFixture + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json j;
  std::ifstream(kFixture + "/config.json") >> j;
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir;
}

TEST(HfUnmodelledCli, TrainRefusesGeluAndLinearRopeNamingTheField) {
  const std::string gelu = edited_copy("gelu", [](nlohmann::json& j) { j["hidden_act"] = "gelu"; });
  CliRun r = run_cli("train --model " + gelu + " --steps 1 --seq-len 16 --symbols 8 --schedules none", 60);
  expect_one_line_error(r, "hidden_act = \"gelu\": the trainer implements SiLU (\"silu\") only");
  const std::string yarn = edited_copy("yarn", [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  });
  r = run_cli("train --model " + yarn + " --steps 1 --seq-len 16 --symbols 8 --schedules none", 60);
  expect_one_line_error(r, "rope_parameters.rope_type = \"linear\"");
  // YaRN without its pretraining length: one line naming the field.
  const std::string bare = edited_copy("yarn_bare", [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  });
  r = run_cli("train --model " + bare + " --steps 1 --seq-len 16 --symbols 8 --schedules none", 60);
  expect_one_line_error(r, "original_max_position_embeddings");
  fs::remove_all(bare);
  fs::remove_all(gelu);
  fs::remove_all(yarn);
}

// A NaN in the weights: named at load with its tensor, file and element (step 1 used to
// blame model.embed_tokens.weight and advise a lower --lr).
TEST(HfUnmodelledCli, TrainNamesANanWeightAtLoad) {
  const std::string dir = edited_copy("nan", [](nlohmann::json&) {});
  const std::string file = dir + "/model.safetensors";
  {
    std::vector<std::vector<std::byte>> data;
    std::vector<SafeTensorOut> out;
    {
      const SafeTensorsFile f = SafeTensorsFile::open(file);
      data.reserve(f.tensors().size());
      for (const SafeTensorInfo& t : f.tensors()) {
        const auto b = f.bytes(t.name);
        data.emplace_back(b.begin(), b.end());
        if (t.name == "model.layers.0.mlp.gate.weight") {
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::memcpy(data.back().data() + 17 * sizeof(float), &nan, sizeof nan);
        }
        out.push_back({t.name, t.dtype, t.shape, nullptr, b.size()});
      }
    }
    for (std::size_t i = 0; i < out.size(); ++i) out[i].data = data[i].data();
    write_safetensors(file, out);
  }
  const CliRun r = run_cli("train --model " + dir + " --steps 1 --seq-len 16 --symbols 8 --schedules none", 60);
  expect_one_line_error(r, "model.layers.0.mlp.gate.weight in " + file + " holds NaN at element 17");
  fs::remove_all(dir);
}

TEST(HfUnmodelledCli, ConfigFifoIsRefusedAtOnce) {
  const std::string fifo = ::testing::TempDir() + "/pb_cli_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliRun r = run_cli("train --config " + fifo + " --steps 1", 30);  // a hang would exit 124
  ::unlink(fifo.c_str());
  expect_one_line_error(r, "--config " + fifo + " is not a regular file (a FIFO)");
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::testing
