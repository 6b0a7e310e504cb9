// A training checkpoint whose files pass the CRC check but hold a NaN (written so, or
// edited and re-summed) is refused at load naming the tensor, the file and the element, on
// every rank, instead of training from it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;

struct CkRun {
  ModelConfig config = testing::small_train_config("nonfinite-test");
  ParallelLayout layout;
  CpuDevice dev{128 << 20};
  HostMemory host;
  ThreadPool pool{1};
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
  std::unique_ptr<Trainer> trainer;

  CkRun() {
    const int W = testing::world().size();
    layout.ep = W;
    while (8 % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
    layout.vocab = W;
    groups = ProcessGroups::split(testing::world(), layout);
    model = std::make_unique<MoeTransformer>(dev, host, groups, config, ModelSchedules{});
    model->init_parameters(7);
    TrainerOptions o;
    o.optimizer = "device";
    o.lr = LrSchedule{3e-3f, 3e-4f, 2, 8};
    trainer = std::make_unique<Trainer>(*model, host, pool, o);
  }
};

TEST(CheckpointNonFinite, NanWithAValidCrcIsNamedAtLoad) {
  Communicator& world = testing::world();
  const std::string dir =
      (fs::path(::testing::TempDir()) / ("pb_ckpt_nonfinite_" + std::to_string(world.size()))).string();
  if (world.rank() == 0) fs::remove_all(dir);
  world.barrier();
  {
    CkRun a;
    RunState st;
    st.step = 1;
    save_checkpoint(dir, *a.trainer, st, a.config, a.layout);
  }
  const fs::path step = fs::path(dir) / "step-00000001";
  const std::string model = (step / "rank-00000.model.safetensors").string();
  std::string expected;
  if (world.rank() == 0) {
    // Element 3 of rank 0's first piece becomes NaN; the file is rewritten with the same
    // placements and the manifest re-summed, so only the values are wrong.
    std::vector<std::vector<std::byte>> data;
    std::vector<SafeTensorOut> out;
    std::map<std::string, std::string> metadata;
    {
      const SafeTensorsFile f = SafeTensorsFile::open(model);
      metadata = f.metadata();
      data.reserve(f.tensors().size());
      for (const SafeTensorInfo& t : f.tensors()) {
        const auto b = f.bytes(t.name);
        data.emplace_back(b.begin(), b.end());
        out.push_back({t.name, t.dtype, t.shape, nullptr, b.size()});
      }
      const SafeTensorInfo& first = f.tensors().front();
      ASSERT_GE(first.shape[0], 4);
      const nlohmann::json placement = nlohmann::json::parse(metadata.at(first.name));
      expected = first.name + " in " + model + " holds NaN at element " +
                 std::to_string(placement["begin"].get<std::uint64_t>() + 3);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(data[0].data() + 3 * sizeof(float), &nan, sizeof nan);
    for (std::size_t i = 0; i < out.size(); ++i) out[i].data = data[i].data();
    FileSum sum;
    write_safetensors(model, out, metadata, &sum);
    nlohmann::json manifest;
    std::ifstream(step / "manifest.json") >> manifest;
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", sum.crc);
    for (nlohmann::json& f : manifest["files"])
      if (f["name"] == "rank-00000.model.safetensors") {
        f["bytes"] = sum.bytes;
        f["crc32"] = crc;
      }
    std::ofstream(step / "manifest.json") << manifest.dump(2) << "\n";
  }
  world.barrier();
  CkRun b;
  std::string what;
  try {
    load_checkpoint(resolve_checkpoint(dir), *b.trainer);
    ADD_FAILURE() << "loaded a checkpoint holding a NaN";
  } catch (const Error& e) {
    what = e.what();
  }
  if (world.rank() == 0) {
    EXPECT_NE(what.find(expected), std::string::npos) << what << "\nwanted: " << expected;
  }
  EXPECT_FALSE(what.empty());  // every rank fails (rank 0 reads the damaged piece)
  world.barrier();
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
