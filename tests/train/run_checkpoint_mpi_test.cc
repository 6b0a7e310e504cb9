// Training checkpoints (train/run_checkpoint.h) at 1-4 ranks:
//  - N steps straight against N/2 steps, save, a fresh model and trainer, load, N/2 steps:
//    the same loss bits at every step and the same parameter bits at the end, with every
//    schedule on and with every schedule off;
//  - a checkpoint taken on one layout loads on another (EP, vocabulary group, CP and the
//    optimizer schedule changed): the same parameters, and the next step's loss to 1e-5;
//  - a truncated, corrupted or missing file, a damaged `latest` or manifest: one
//    AgreedError naming the file, on every rank;
//  - a save that cannot write (a file-size limit standing in for a full disk): an Error,
//    `latest` and the previous checkpoint intact and loadable.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/kv_retrieval_task.h"
#include "peakbound/train/run_checkpoint.h"
#include "peakbound/train/trainer.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

namespace fs = std::filesystem;

ModelConfig ck_config() { return testing::small_train_config("ckpt-test"); }

struct RunSetup {
  ModelConfig config = ck_config();
  std::string hf_dir;  // load these weights before the trainer takes its master copy
  ParallelLayout layout;
  bool all = true;
  std::string optimizer = "offload_stream";
  Precision precision = Precision::f32;
};

RunSetup default_setup(bool all) {
  const int W = testing::world().size();
  RunSetup s;
  s.all = all;
  s.optimizer = all ? "offload_stream" : "device";
  s.layout.ep = W;
  while (8 % s.layout.ep != 0 || W % s.layout.ep != 0) --s.layout.ep;
  s.layout.vocab = W;
  return s;
}

// A model and trainer on this rank (the same seed, so the same initial model).
struct TrainRun {
  std::unique_ptr<CpuDevice> dev;
  HostMemory host;
  ThreadPool pool{1};
  ProcessGroups groups;
  std::unique_ptr<MoeTransformer> model;
  std::unique_ptr<Trainer> trainer;
  RunSetup setup;

  explicit TrainRun(const RunSetup& s) : setup(s) {
    dev = std::make_unique<CpuDevice>(128 << 20);
    groups = ProcessGroups::split(testing::world(), s.layout);
    ModelSchedules sch;
    sch.dispatch = s.all ? DispatchKind::pipelined_llep : DispatchKind::standard_ep;
    sch.dispatch_options.cap = 5;
    sch.ring_dtp = s.all;
    sch.vocab.chunk = 7;
    sch.checkpoint.schedule = s.all ? CheckpointSchedule::sco : CheckpointSchedule::resident;
    sch.precision = s.precision;
    model = std::make_unique<MoeTransformer>(*dev, host, groups, s.config, sch);
    model->init_parameters(7);
    if (!s.hf_dir.empty()) model->load_hf(s.hf_dir);
    TrainerOptions o;
    o.optimizer = s.optimizer;
    o.optimizer_options.adam.lr = 3e-3f;
    o.optimizer_options.adam.weight_decay = 0.1f;
    o.optimizer_options.bucket_bytes = 4096;
    o.lr = LrSchedule{3e-3f, 3e-4f, 2, 8};
    trainer = std::make_unique<Trainer>(*model, host, pool, o);
  }

  // Step `step` (1-based) of the run: the global batch of the step, this rank's part.
  double step(std::int64_t step) {
    const KvRetrievalTask task = KvRetrievalTask::standard(setup.config.vocab_size, 24, 11);
    const int W = testing::world().size(), r = testing::world().rank();
    const int cp = static_cast<int>(setup.layout.cp), d = r / cp, dp = W / cp;
    std::vector<std::int32_t> ids, tgt;
    const std::int64_t n = 2 * cp;  // 2 sequences a rank's worth of tokens per cp group
    for (std::int64_t b = 0; b < n; ++b) {
      const KvRetrievalTask::Sequence s = task.sequence(((step - 1) * dp + d) * n + b);
      ids.insert(ids.end(), s.inputs.begin(), s.inputs.end());
      tgt.insert(tgt.end(), s.targets.begin(), s.targets.end());
    }
    const MicroBatch mb{ids.data(), tgt.data(), n, 24};
    return trainer->step({&mb, 1}).loss;
  }

  // Every parameter of the model, gathered whole on every rank (FSDP units, experts and
  // head by name), for bitwise comparisons across layouts.
  std::vector<float> all_parameters() {
    std::vector<float> out;
    FsdpUnits& f = model->fsdp();
    for (std::size_t u = 0; u < f.size(); ++u) {
      std::vector<float> unit(f.layout(u).elements);
      dev->synchronize();
      f.gather(u, unit.data());
      for (const ParameterView& v : f.layout(u).views)
        out.insert(out.end(), unit.begin() + static_cast<std::ptrdiff_t>(v.offset),
                   unit.begin() + static_cast<std::ptrdiff_t>(v.offset) + v.numel());
    }
    // The stores: this rank's shard of the optimizer holds disjoint pieces; read the
    // master weights through the segments and sum them over the world into full tensors.
    const std::vector<ShardSegment> segs = trainer->shard_segments();
    std::vector<float> master(trainer->shard_elements()), m(master.size()), v(master.size());
    trainer->read_shard(master.data(), m.data(), v.data());
    for (const char* prefix : {"model.layers.", "lm_head."}) {
      for (const TensorEntry& e : model->table().entries()) {
        if (e.name.rfind(prefix, 0) != 0 || (!e.expert_sharded && !e.vocab_sharded)) continue;
        std::vector<float> full(static_cast<std::size_t>(e.numel()), 0.0f);
        for (const ShardSegment& s : segs)
          if (s.name == e.name)
            std::copy_n(master.data() + s.shard_offset, s.count, full.data() + s.begin);
        testing::world().all_reduce(full.data(), full.size(), DType::f32, ReduceOp::sum);
        out.insert(out.end(), full.begin(), full.end());
      }
    }
    return out;
  }
};

std::string test_dir(const std::string& name) {
  // One folder for every rank (rank 0's temp dir, broadcast by construction: the same path).
  return (fs::path(::testing::TempDir()) / ("pb_ckpt_" + name + "_" + std::to_string(testing::world().size())))
      .string();
}

void fresh(const std::string& dir) {
  if (testing::world().rank() == 0) fs::remove_all(dir);
  testing::world().barrier();
}

TEST(RunCheckpoint, ResumeIsBitwiseWithEveryScheduleOnAndOff) {
  for (const bool all : {true, false}) {
    SCOPED_TRACE(all ? "all" : "none");
    const std::string dir = test_dir(all ? "bitwise_all" : "bitwise_none");
    fresh(dir);
    std::vector<double> straight, resumed;
    std::vector<float> straight_params, resumed_params;
    {
      TrainRun a(default_setup(all));
      for (int s = 1; s <= 6; ++s) straight.push_back(a.step(s));
      straight_params = a.all_parameters();
    }
    {
      TrainRun b(default_setup(all));
      for (int s = 1; s <= 3; ++s) resumed.push_back(b.step(s));
      RunState st;
      st.step = 3;
      st.sequences_consumed = 3 * 2 * testing::world().size();
      save_checkpoint(dir, *b.trainer, st, ck_config(), b.setup.layout);
    }
    {
      TrainRun c(default_setup(all));
      const RunState st = load_checkpoint(resolve_checkpoint(dir), *c.trainer);
      EXPECT_EQ(st.step, 3);
      EXPECT_EQ(c.trainer->steps_taken(), 3);
      for (int s = 4; s <= 6; ++s) resumed.push_back(c.step(s));
      resumed_params = c.all_parameters();
    }
    ASSERT_EQ(straight.size(), resumed.size());
    for (std::size_t i = 0; i < straight.size(); ++i)
      EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1 << " (bit for bit)";
    ASSERT_EQ(straight_params.size(), resumed_params.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < straight_params.size(); ++i)
      differ += std::memcmp(&straight_params[i], &resumed_params[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "of " << straight_params.size() << " parameters";
  }
}

// Under bf16 the checkpoint holds the fp32 master and m, v (the bf16 compute copies are
// rounded from the master on load): a resumed run's losses and its optimizer state (master,
// m, v on every rank) are the straight run's bit for bit, with every schedule on and off.
TEST(RunCheckpoint, ResumeIsBitwiseInBf16) {
  for (const bool all : {true, false}) {
    SCOPED_TRACE(all ? "all" : "none");
    const std::string dir = test_dir(all ? "bf16_all" : "bf16_none");
    fresh(dir);
    RunSetup setup = default_setup(all);
    setup.precision = Precision::bf16;
    std::vector<double> straight, resumed;
    std::vector<float> straight_state, resumed_state;
    const auto state = [](const Trainer& t) {
      const std::size_t n = t.shard_elements();
      std::vector<float> s(3 * n);
      t.read_shard(s.data(), s.data() + n, s.data() + 2 * n);
      return s;
    };
    {
      TrainRun a(setup);
      for (int s = 1; s <= 6; ++s) straight.push_back(a.step(s));
      straight_state = state(*a.trainer);
    }
    {
      TrainRun b(setup);
      for (int s = 1; s <= 3; ++s) resumed.push_back(b.step(s));
      RunState st;
      st.step = 3;
      st.sequences_consumed = 3 * 2 * testing::world().size();
      save_checkpoint(dir, *b.trainer, st, ck_config(), b.setup.layout);
    }
    {
      TrainRun c(setup);
      const RunState st = load_checkpoint(resolve_checkpoint(dir), *c.trainer);
      EXPECT_EQ(st.step, 3);
      for (int s = 4; s <= 6; ++s) resumed.push_back(c.step(s));
      resumed_state = state(*c.trainer);
    }
    ASSERT_EQ(straight.size(), resumed.size());
    for (std::size_t i = 0; i < straight.size(); ++i)
      EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1 << " (bit for bit)";
    EXPECT_NE(straight.front(), straight.back()) << "the run did not train";
    ASSERT_EQ(straight_state.size(), resumed_state.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < straight_state.size(); ++i)
      differ += std::memcmp(&straight_state[i], &resumed_state[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "of " << straight_state.size() << " master, m and v elements on rank "
                          << testing::world().rank();
  }
}

TEST(RunCheckpoint, LoadsOnAnotherLayout) {
  Communicator& world = testing::world();
  const std::string dir = test_dir("reshard");
  fresh(dir);
  const RunSetup from = default_setup(true);
  std::vector<float> saved;
  double next_loss = 0;
  {
    TrainRun a(from);
    for (int s = 1; s <= 2; ++s) a.step(s);
    RunState st;
    st.step = 2;
    save_checkpoint(dir, *a.trainer, st, ck_config(), from.layout);
    saved = a.all_parameters();
    next_loss = a.step(3);
  }
  // Another expert group, vocabulary group, context-parallel size and optimizer schedule.
  std::vector<RunSetup> targets;
  RunSetup t = default_setup(false);
  t.layout.ep = 1;
  t.layout.vocab = 1;
  targets.push_back(t);
  if (world.size() % 2 == 0) {
    t.layout.cp = 2;
    t.layout.ep = 2;
    t.layout.vocab = 2;
    t.optimizer = "offload_serial";
    targets.push_back(t);
  }
  for (const RunSetup& to : targets) {
    SCOPED_TRACE("ep " + std::to_string(to.layout.ep) + " vocab " + std::to_string(to.layout.vocab) + " cp " +
                 std::to_string(to.layout.cp));
    TrainRun b(to);
    load_checkpoint(resolve_checkpoint(dir), *b.trainer);
    const std::vector<float> got = b.all_parameters();
    ASSERT_EQ(got.size(), saved.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != saved[i];
    EXPECT_EQ(differ, 0u);
    // The step after: the same math on another layout (the sums in another order).
    const double loss = b.step(3);
    EXPECT_LT(std::abs(loss - next_loss) / next_loss, 1e-5) << next_loss << " vs " << loss;
  }
}

// Rank 0 damages the checkpoint, every rank tries to load it: every rank throws.
void expect_refused(const std::string& dir, const std::function<void()>& damage, const std::string& needle) {
  Communicator& world = testing::world();
  if (world.rank() == 0) damage();
  world.barrier();
  TrainRun r(default_setup(true));
  try {
    load_checkpoint(resolve_checkpoint(dir), *r.trainer);
    ADD_FAILURE() << "loaded a damaged checkpoint (" << needle << ")";
  } catch (const Error& e) {  // AgreedError from the load, InvalidArgument from `latest`
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  world.barrier();
}

TEST(RunCheckpoint, DamagedCheckpointsAreRefusedNamingTheFile) {
  Communicator& world = testing::world();
  const std::string dir = test_dir("damaged");
  fresh(dir);
  {
    TrainRun a(default_setup(true));
    a.step(1);
    RunState st;
    st.step = 1;
    save_checkpoint(dir, *a.trainer, st, ck_config(), a.setup.layout);
  }
  const fs::path step = fs::path(dir) / "step-00000001";
  const fs::path model = step / "rank-00000.model.safetensors", optim = step / "rank-00000.optim.safetensors";
  const auto backup = [&](const fs::path& p) {
    if (world.rank() == 0) fs::copy_file(p, p.string() + ".bak", fs::copy_options::overwrite_existing);
    world.barrier();
  };
  const auto restore = [&](const fs::path& p) {
    if (world.rank() == 0) fs::copy_file(p.string() + ".bak", p, fs::copy_options::overwrite_existing);
    world.barrier();
  };
  backup(model);
  expect_refused(dir, [&] { fs::resize_file(model, fs::file_size(model) - 9); }, "is truncated or altered");
  restore(model);
  backup(optim);
  expect_refused(dir, [&] {
    std::fstream f(optim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(optim) / 2));
    f.put('\x5a');
  }, "is corrupted: CRC-32");
  restore(optim);
  expect_refused(dir, [&] { fs::rename(model, model.string() + ".gone"); }, "is missing");
  if (world.rank() == 0) fs::rename(model.string() + ".gone", model);
  world.barrier();
  backup(step / "manifest.json");
  expect_refused(dir, [&] { std::ofstream(step / "manifest.json") << "{\"format\": \"peakbound-checkpoint\", \"vers"; },
                 "is not valid JSON");
  restore(step / "manifest.json");
  expect_refused(dir, [&] { std::ofstream(fs::path(dir) / "latest") << "../../etc\n"; }, "is damaged");
  if (world.rank() == 0) std::ofstream(fs::path(dir) / "latest") << "step-00000001\n";
  world.barrier();
  // Intact again: it loads.
  TrainRun ok(default_setup(true));
  EXPECT_EQ(load_checkpoint(resolve_checkpoint(dir), *ok.trainer).step, 1);
  EXPECT_THROW(resolve_checkpoint(dir + "/nothing-here"), InvalidArgument);
}

// The last rank's file damaged: every rank throws the same AgreedError (the CLI prints
// it once, from rank 0, and no rank aborts the job).
TEST(RunCheckpoint, ALoadFailureIsTheSameAgreedErrorOnEveryRank) {
  Communicator& world = testing::world();
  const std::string dir = test_dir("agreed");
  fresh(dir);
  {
    TrainRun a(default_setup(true));
    a.step(1);
    RunState st;
    st.step = 1;
    save_checkpoint(dir, *a.trainer, st, ck_config(), a.setup.layout);
  }
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d.optim.safetensors", world.size() - 1);
  const fs::path optim = fs::path(dir) / "step-00000001" / name;
  if (world.rank() == 0) {
    std::fstream f(optim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(optim) / 2));
    f.put('\x5a');
  }
  world.barrier();
  TrainRun r(default_setup(true));
  std::string what;
  try {
    load_checkpoint(resolve_checkpoint(dir), *r.trainer);
    ADD_FAILURE() << "loaded a damaged checkpoint";
  } catch (const AgreedError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find(name), std::string::npos) << what;
  // The same message everywhere: its length and CRC agree over the ranks.
  std::int64_t sig[2] = {static_cast<std::int64_t>(what.size()), static_cast<std::int64_t>(crc32(what.data(), what.size()))};
  std::int64_t lo[2] = {-sig[0], -sig[1]};
  world.all_reduce(sig, 2, DType::i64, ReduceOp::max);
  world.all_reduce(lo, 2, DType::i64, ReduceOp::max);
  EXPECT_EQ(sig[0], -lo[0]);
  EXPECT_EQ(sig[1], -lo[1]);
  world.barrier();
}

// A full disk, simulated by a file-size limit (writes past it fail with EFBIG, as they
// fail with ENOSPC on a full disk): the save throws an Error naming the file on every
// rank, and the previous checkpoint and `latest` still load.
TEST(RunCheckpoint, AFailedSaveLeavesThePreviousCheckpoint) {
  Communicator& world = testing::world();
  const std::string dir = test_dir("full");
  fresh(dir);
  TrainRun a(default_setup(true));
  a.step(1);
  RunState st;
  st.step = 1;
  save_checkpoint(dir, *a.trainer, st, ck_config(), a.setup.layout);
  a.step(2);
  st.step = 2;
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  if (world.rank() == world.size() - 1) {  // one rank's disk fills
    rlimit small = old;
    small.rlim_cur = 4096;
    setrlimit(RLIMIT_FSIZE, &small);
  }
  try {
    save_checkpoint(dir, *a.trainer, st, ck_config(), a.setup.layout);
    ADD_FAILURE() << "a save past the file-size limit succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (world.rank() == world.size() - 1) EXPECT_NE(what.find("File too large"), std::string::npos) << what;
    else EXPECT_NE(what.find("previous checkpoint is intact"), std::string::npos) << what;
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  world.barrier();
  EXPECT_EQ(fs::path(resolve_checkpoint(dir)).filename(), "step-00000001");
  EXPECT_FALSE(fs::exists(fs::path(dir) / ".step-00000002.tmp"));
  TrainRun b(default_setup(true));
  EXPECT_EQ(load_checkpoint(resolve_checkpoint(dir), *b.trainer).step, 1);
}

// export_hf assembles every rank's pieces into whole tensors under their Hugging Face
// names: loading the exported folder (the path users take, load_hf) gives the model the
// checkpoint was saved from, bit for bit (the transformers side: scripts/hf_reference/check_export.py).
TEST(RunCheckpoint, ExportWritesTheSavedModel) {
  Communicator& world = testing::world();
  RunSetup s = default_setup(true);
  const std::string dir = test_dir("export"), out = dir + "_hf";
  // gpt-oss too: the run holds its experts as packed rows, the export fuses them back
  // into the checkpoint's interleaved gate_up_proj (and the load takes them apart again).
  for (const char* family : {"qwen3_moe", "gpt_oss"}) {
    SCOPED_TRACE(family);
    const std::string fixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/" + family;
    std::ifstream in(fixture + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    s = default_setup(true);
    s.config = load_hf_config(fixture + "/config.json");
    s.hf_dir = fixture;
    fresh(dir);
    std::vector<float> saved;
    {
      TrainRun a(s);
      a.step(1);
      a.step(2);
      RunState st;
      st.step = 2;
      st.hf_config = text.str();
      save_checkpoint(dir, *a.trainer, st, s.config, s.layout);
      saved = a.all_parameters();
    }
    if (world.rank() == 0) {
      std::filesystem::remove_all(out);
      EXPECT_EQ(export_hf(resolve_checkpoint(dir), out), DType::f32);  // the fixture's float32
    }
    world.barrier();
    RunSetup t = s;
    t.hf_dir = out;
    TrainRun b(t);
    const std::vector<float> got = b.all_parameters();
    ASSERT_EQ(got.size(), saved.size());
    EXPECT_EQ(std::memcmp(got.data(), saved.data(), got.size() * sizeof(float)), 0);
    world.barrier();
  }
  // A checkpoint of a preset has no config.json: export says why.
  const std::string preset = test_dir("export_preset");
  fresh(preset);
  {
    TrainRun c(default_setup(true));
    c.step(1);
    RunState st;
    st.step = 1;
    save_checkpoint(preset, *c.trainer, st, ck_config(), c.setup.layout);
  }
  if (world.rank() == 0) {
    try {
      export_hf(resolve_checkpoint(preset), out + "_preset");
      ADD_FAILURE() << "exported a preset model";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("holds no config.json"), std::string::npos) << e.what();
    }
  }
  world.barrier();
}

// export --dtype (issue 28): a run started from a bfloat16 model exports bf16 by default,
// every tensor bitwise to_bf16 of the f32 export's (the fp32 master weights rounded once),
// the header saying BF16 and config.json "bfloat16"; f32 on request, as before. Loading
// the bf16 export gives the saved model rounded to bf16, bit for bit.
TEST(RunCheckpoint, ExportWritesTheDtypeAskedDefaultingToTheSourceModels) {
  Communicator& world = testing::world();
  const std::string fixture = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_moe";
  std::ifstream in(fixture + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  std::string config = text.str();
  const std::string f32_field = "\"dtype\": \"float32\"";
  const std::size_t at = config.find(f32_field);
  ASSERT_NE(at, std::string::npos);
  config.replace(at, f32_field.size(), "\"dtype\": \"bfloat16\"");  // as if the run started from a bf16 model
  RunSetup s = default_setup(true);
  s.config = load_hf_config(fixture + "/config.json");
  s.hf_dir = fixture;
  const std::string dir = test_dir("export_dtype"), out_bf = dir + "_hf_bf16", out_f = dir + "_hf_f32";
  fresh(dir);
  std::vector<float> saved;
  {
    TrainRun a(s);
    a.step(1);
    RunState st;
    st.step = 1;
    st.hf_config = config;
    save_checkpoint(dir, *a.trainer, st, s.config, s.layout);
    saved = a.all_parameters();
  }
  if (world.rank() == 0) {
    const std::string step = resolve_checkpoint(dir);
    EXPECT_EQ(export_hf(step, out_bf), DType::bf16);
    EXPECT_EQ(export_hf(step, out_f, DType::f32), DType::f32);
    for (const auto& [o, name] : {std::pair{out_bf, "bfloat16"}, std::pair{out_f, "float32"}}) {
      std::ifstream c(o + "/config.json");
      const nlohmann::json j = nlohmann::json::parse(c);
      EXPECT_EQ(j["dtype"], name) << o;
      EXPECT_EQ(j["model_type"], "qwen3_moe") << o;
    }
    const SafeTensorsFile bf = SafeTensorsFile::open(out_bf + "/model.safetensors");
    const SafeTensorsFile f = SafeTensorsFile::open(out_f + "/model.safetensors");
    ASSERT_EQ(bf.tensors().size(), f.tensors().size());
    ASSERT_GT(f.tensors().size(), 0u);
    for (const SafeTensorInfo& t : f.tensors()) {
      EXPECT_EQ(t.dtype, "F32") << t.name;
      const SafeTensorInfo& b = bf.info(t.name);
      EXPECT_EQ(b.dtype, "BF16") << t.name;
      EXPECT_EQ(b.shape, t.shape) << t.name;
      const std::vector<float> x = f.read_f32(t.name);
      const auto bytes = bf.bytes(t.name);
      ASSERT_EQ(bytes.size(), 2 * x.size()) << t.name;
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t got;
        std::memcpy(&got, bytes.data() + 2 * i, 2);
        ASSERT_EQ(got, to_bf16(x[i]).bits) << t.name << "[" << i << "]";
      }
    }
  }
  world.barrier();
  for (const bool bf16 : {true, false}) {
    RunSetup t = s;
    t.hf_dir = bf16 ? out_bf : out_f;
    TrainRun b(t);
    const std::vector<float> got = b.all_parameters();
    ASSERT_EQ(got.size(), saved.size());
    std::size_t rounded = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float want = bf16 ? to_f32(to_bf16(saved[i])) : saved[i];
      rounded += want != saved[i];
      ASSERT_EQ(float_bits(got[i]), float_bits(want)) << (bf16 ? "bf16" : "f32") << " element " << i;
    }
    if (bf16) {
      EXPECT_GT(rounded, got.size() / 2);  // the bf16 export did round (trained weights are not bf16 values)
    }
  }
  world.barrier();
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
