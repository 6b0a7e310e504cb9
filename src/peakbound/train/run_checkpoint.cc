#include "peakbound/train/run_checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "peakbound/comm/agree.h"
#include "peakbound/core/error.h"
#include "peakbound/io/path_check.h"
#include "peakbound/io/atomic_file.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/describe.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/gpt_oss_experts.h"
#include "peakbound/train/hf_checkpoint.h"

namespace peakbound {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "peakbound-checkpoint";
constexpr int kVersion = 1;

std::string step_name(std::int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}

std::string rank_file(int rank, const char* kind) {
  char b[48];
  std::snprintf(b, sizeof b, "rank-%05d.%s.safetensors", rank, kind);
  return b;
}

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// One rank's file of pieces: the tensors, with each piece's place in its tensor.
FileSum write_pieces(const std::string& path, const std::vector<ShardSegment>& segs, const std::vector<const float*>& data,
                     const std::vector<std::string>& suffixes) {
  std::vector<SafeTensorOut> out;
  std::map<std::string, std::string> meta;
  meta["format"] = "peakbound-shard";
  for (std::size_t k = 0; k < data.size(); ++k)
    for (const ShardSegment& s : segs) {
      const std::string name = s.name + suffixes[k];
      out.push_back({name, "F32", {static_cast<std::int64_t>(s.count)}, data[k] + s.shard_offset, s.count * sizeof(float)});
      meta[name] = nlohmann::json{{"tensor", s.name}, {"begin", s.begin}, {"shape", s.shape}}.dump();
    }
  FileSum sum;
  write_safetensors(path, out, meta, &sum);
  return sum;
}

// Every rank's verdict on a step that may fail on some: when any failed, every rank
// throws the same AgreedError, the lowest failing rank's message (comm/agree.h).
void agree_on(Communicator& world, const std::string& own_error) {
  agree(world, [&] {
    if (!own_error.empty()) throw Error(own_error);
  });
}

// What `latest` holds, fit to quote: short printable text as it is, else its size.
std::string quote_name(const std::string& name) {
  bool printable = name.size() <= 64;
  for (unsigned char ch : name) printable = printable && ch >= 0x20 && ch < 0x7f;
  if (printable) return "'" + name + "'";
  return "not a step name (" + std::to_string(name.size()) + " bytes of binary)";
}

// The run id a manifest names; nullopt when it predates run ids.
std::optional<std::string> manifest_run_id(const nlohmann::json& j) {
  if (j.contains("run_id") && j["run_id"].is_string()) return j["run_id"].get<std::string>();
  return std::nullopt;
}

bool hidden_temporary(const std::string& name) { return !name.empty() && name[0] == '.' && name.find(".tmp") != std::string::npos; }

void bad_checkpoint(const std::string& what) { throw InvalidArgument("checkpoint " + what); }

// A file of a checkpoint folder that exists but is not a regular file (a FIFO would
// block the read forever): refused by name before it is opened.
void refuse_special_file(const fs::path& p, const char* expected) {
  std::error_code ec;
  if (!fs::exists(p, ec) || fs::is_regular_file(p, ec)) return;
  bad_checkpoint(input_file_problem(p.string(), "", expected));
}

std::string dir_error(const std::string& where, const char* what) { return where + ": " + what; }

}  // namespace

// One save in flight: the host copies, the writer thread, what it found.
struct CheckpointWriter::Pending {
  RunState state;
  ModelConfig config;
  ParallelLayout layout;
  std::string optimizer;
  std::int64_t optimizer_steps = 0;
  fs::path tmp, final_dir;
  std::vector<float> master, m, v;
  std::vector<ShardSegment> segs;
  std::vector<ShardSegment> model_segs;  // segs, then (rank 0) the router buffers, whole
  std::uint64_t sums[4] = {0, 0, 0, 0};  // model bytes, crc, optim bytes, crc
  std::string error;
  std::atomic<bool> written{false};
  std::thread thread;
};

CheckpointWriter::CheckpointWriter(std::string dir, SaveOptions options) : dir_(std::move(dir)), options_(options) {
  if (options_.keep < 1) throw InvalidArgument("checkpoint: keep must be >= 1, got " + std::to_string(options_.keep));
}

CheckpointWriter::~CheckpointWriter() {
  // An unfinished save is abandoned: its temporary folder never becomes a checkpoint.
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the folder's lock
}

bool CheckpointWriter::ours(const std::string& step_dir) const {
  try {
    const nlohmann::json j = read_checkpoint_manifest(step_dir);
    const std::optional<std::string> id = manifest_run_id(j);
    return id ? *id == run_id_ : adopt_;
  } catch (const Error&) {
    return false;
  }
}

void CheckpointWriter::claim(Communicator& world, const std::string& run_id, const nlohmann::json& identity, bool adopt) {
  run_id_ = run_id;
  identity_ = identity;
  adopt_ = adopt;
  std::string error;
  if (world.rank() == 0) {
    try {
      const fs::path root(dir_);
      prepare_save_folder(dir_);
      // The lock: held by this process (rank 0) until the writer goes; the holder's pid
      // and host in the file name it to a second run.
      const std::string lock = (root / ".lock").string();
      const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) throw Error("checkpoint folder '" + dir_ + "': cannot create " + lock + ": " + std::strerror(errno));
      const int locked = ::flock(fd, LOCK_EX | LOCK_NB);
      const int err = locked != 0 ? errno : 0;
      const bool no_locks = locked != 0 && (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL);
      // A file system without locks (Lustre mounted without flock, some NFS): the run
      // goes on with the identity checks only, and says so (locked()).
      if (no_locks) {
        ::close(fd);
      } else if (locked != 0) {
        char buf[128] = {};
        const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
        ::close(fd);
        std::string holder = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
        if (err != EWOULDBLOCK)
          throw Error("checkpoint folder '" + dir_ + "': cannot lock " + lock + ": " + std::strerror(err));
        bool printable = !holder.empty();
        for (unsigned char ch : holder) printable = printable && ch >= 0x20 && ch < 0x7f;
        throw Error("checkpoint folder '" + dir_ + "' is in use by another run (" +
                    (printable ? holder : std::string("its pid unknown")) +
                    "); one folder holds one run: choose another --save-dir, or stop that run first");
      }
      if (!no_locks) {
        lock_fd_ = fd;
        char host[256] = {};
        ::gethostname(host, sizeof host - 1);
        const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
        if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
          // The lock holds without the note; a second run just cannot name this one.
        }
      }
      // Whose folder it is: run.json names its run; a run.json whose run left no
      // checkpoint here (killed during its first save) guards nothing and is replaced.
      const fs::path run_json = root / "run.json";
      std::error_code ec;
      nlohmann::json owner;
      if (fs::exists(run_json, ec)) {
        refuse_special_file(run_json, "the run's identity (run.json)");
        try {
          std::ifstream in(run_json);
          in >> owner;
        } catch (const nlohmann::json::exception&) {
          owner = nullptr;
        }
        if (!owner.is_object() || !owner.contains("run_id") || !owner["run_id"].is_string())
          throw Error("checkpoint folder '" + dir_ + "': its run.json is damaged; choose another --save-dir");
        identity_written_ = owner["run_id"].get<std::string>() == run_id_;
      }
      if (!identity_written_) {
        std::string foreign, other_run;
        for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
          const std::string name = e.path().filename().string();
          if (name == ".lock" || name == "run.json" || name == "latest" || hidden_temporary(name)) continue;
          if (name.rfind("step-", 0) == 0 && e.is_directory()) {
            bool mine = false, peakbound = true;
            try {
              const std::optional<std::string> id = manifest_run_id(read_checkpoint_manifest(e.path().string()));
              mine = id ? *id == run_id_ : adopt_;
            } catch (const Error&) {
              peakbound = false;
            }
            if (!peakbound) foreign = name;
            else if (!mine) other_run = name;
            continue;
          }
          foreign = name;
        }
        if (!other_run.empty()) {
          std::string who;
          for (const char* k : {"model", "seed", "seq_len", "schedules"})
            if (owner.is_object() && owner.contains("identity") && owner["identity"].is_object() &&
                owner["identity"].contains(k))
              who += std::string(who.empty() ? "" : ", ") + k + " " +
                     (owner["identity"][k].is_string() ? owner["identity"][k].get<std::string>()
                                                       : owner["identity"][k].dump());
          throw Error("checkpoint folder '" + dir_ + "' holds the checkpoints of another run (" +
                      (who.empty() ? other_run : who) + "); choose another --save-dir, or --resume " + dir_ +
                      " to continue that run");
        }
        if (!foreign.empty() && !adopt_)
          throw Error("checkpoint folder '" + dir_ + "' is not empty and was not made by peakbound (it holds " +
                      quote_name(foreign) + "); choose a new or empty --save-dir");
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree_on(world, error);
  claimed_ = true;
}

bool CheckpointWriter::writing() const { return pending_ && !pending_->written.load(); }

void CheckpointWriter::start(const Trainer& trainer, const RunState& state, const ModelConfig& config,
                             const ParallelLayout& layout) {
  Communicator& world = *trainer.model().groups().world;
  if (pending_) (void)finish(world);
  if (!claimed_) claim(world, state.run_id, state.run);
  const int r = world.rank();
  auto p = std::make_unique<Pending>();
  const std::string name = step_name(state.step);
  const fs::path root(dir_);
  p->tmp = root / ("." + name + ".tmp");
  p->final_dir = root / name;
  p->state = state;
  p->config = config;
  p->layout = layout;
  p->optimizer = std::string(trainer.optimizer().name());
  p->optimizer_steps = trainer.optimizer().steps_taken();

  // Rank 0 prepares the temporary folder; every rank learns whether it could.
  std::string error;
  if (r == 0) {
    try {
      std::error_code ec;
      fs::create_directories(root, ec);
      if (ec) throw Error(dir_ + ": cannot create the checkpoint folder: " + ec.message());
      // A step folder in the way that is not this run's (a user's look-alike) is kept.
      if (fs::exists(p->final_dir, ec) && !ours(p->final_dir.string()))
        throw Error("'" + p->final_dir.string() +
                    "' is in the way of this run's checkpoint and is not one of its checkpoints; move it out of "
                    "the folder (it is left as it is)");
      fs::remove_all(p->tmp, ec);
      fs::create_directory(p->tmp, ec);
      if (ec) throw Error(p->tmp.string() + ": cannot create: " + ec.message());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree_on(world, error);

  // The host copies are taken now (the next step may change the state); the files are
  // written by a thread while training goes on.
  const std::uint64_t n = trainer.shard_elements();
  p->master.resize(n);
  p->m.resize(n);
  p->v.resize(n);
  trainer.read_shard(p->master.data(), p->m.data(), p->v.data());
  p->segs = trainer.shard_segments();
  p->model_segs = p->segs;
  // The router buffers (DeepSeek's e_score_correction_bias: state outside the optimizer,
  // the same on every rank) in rank 0's model file, whole, after the shard's pieces.
  if (r == 0) {
    Device& dev = trainer.model().experts().device();
    for (const auto& [name, values] : trainer.model().router_buffers()) {
      const auto E = static_cast<std::uint64_t>(trainer.model().config().num_experts);
      const std::uint64_t at = p->master.size();
      p->master.resize(at + E);
      dev.memcpy_async(p->master.data() + at, values, E * sizeof(float), CopyKind::device_to_host, dev.copy_stream());
      dev.synchronize(dev.copy_stream());
      p->model_segs.push_back(ShardSegment{name, {static_cast<std::int64_t>(E)}, 0, E, at});
    }
  }
  Pending* q = p.get();
  p->thread = std::thread([q, r] {
    try {
      const std::string mp = (q->tmp / rank_file(r, "model")).string(), op = (q->tmp / rank_file(r, "optim")).string();
      const FileSum a = write_pieces(mp, q->model_segs, {q->master.data()}, {""});
      const FileSum b = write_pieces(op, q->segs, {q->m.data(), q->v.data()}, {".exp_avg", ".exp_avg_sq"});
      q->sums[0] = a.bytes;
      q->sums[1] = a.crc;
      q->sums[2] = b.bytes;
      q->sums[3] = b.crc;
    } catch (const Error& e) {
      q->error = e.what();
    } catch (const std::exception& e) {
      q->error = dir_error(q->tmp.string(), e.what());
    }
    q->written.store(true);
  });
  pending_ = std::move(p);
}

std::string CheckpointWriter::finish(Communicator& world) {
  if (!pending_) return "";
  std::unique_ptr<Pending> p = std::move(pending_);
  p->thread.join();
  const int W = world.size(), r = world.rank();
  const fs::path root(dir_);
  std::string error = p->error;
  const auto cleanup = [&] {
    if (r == 0) {
      std::error_code ec;
      fs::remove_all(p->tmp, ec);
    }
  };
  try {
    agree_on(world, error.empty() ? error : error + "; the previous checkpoint is intact");
  } catch (...) {
    world.barrier();
    cleanup();
    throw;
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(4 * W));
  world.all_gather(p->sums, all.data(), 4, DType::i64);  // 8-byte words, gathered as they are

  // Rank 0: the manifest, the folder's rename, `latest`, the old folders' removal.
  if (r == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      if (!p->state.hf_config.empty()) {
        const std::string cp = (p->tmp / "config.json").string();
        write_text_atomic(cp, p->state.hf_config);
        const FileSum cs = file_sum(cp);
        files.push_back({{"name", "config.json"}, {"bytes", cs.bytes}, {"crc32", hex32(cs.crc)}});
      }
      for (int k = 0; k < W; ++k) {
        const std::uint64_t* s = all.data() + 4 * k;
        files.push_back({{"name", rank_file(k, "model")}, {"bytes", s[0]}, {"crc32", hex32(static_cast<std::uint32_t>(s[1]))}});
        files.push_back({{"name", rank_file(k, "optim")}, {"bytes", s[2]}, {"crc32", hex32(static_cast<std::uint32_t>(s[3]))}});
      }
      const ParallelLayout& l = p->layout;
      const nlohmann::json manifest = {
          {"format", kFormat},
          {"version", kVersion},
          {"step", p->state.step},
          {"sequences_consumed", p->state.sequences_consumed},
          {"seed", p->state.seed},
          {"model", to_json(p->config)},
          {"layout", {{"world", W}, {"cp", l.cp}, {"ep", l.ep}, {"vocab_group", l.vocab}}},
          {"optimizer", p->optimizer},
          {"optimizer_steps", p->optimizer_steps},
          {"run_id", run_id_},
          {"run", p->state.run},
          {"files", files}};
      write_text_atomic((p->tmp / "manifest.json").string(), manifest.dump(2) + "\n");
      fsync_directory(p->tmp.string());
      // The folder's owner, before its first checkpoint appears in it.
      if (!identity_written_) {
        const nlohmann::json run = {{"format", "peakbound-run"}, {"run_id", run_id_}, {"identity", identity_}};
        write_text_atomic((root / "run.json").string(), run.dump(2) + "\n");
        identity_written_ = true;
      }
      std::error_code ec;
      if (fs::exists(p->final_dir)) {
        // The same step saved again: swap the folders in one step (`latest` may name the
        // old one, so it must never be missing), then drop the old one.
        if (::renameat2(AT_FDCWD, p->tmp.c_str(), AT_FDCWD, p->final_dir.c_str(), RENAME_EXCHANGE) != 0)
          throw Error(p->final_dir.string() + ": cannot swap in the new checkpoint: " + std::strerror(errno));
        fs::remove_all(p->tmp, ec);
      } else {
        fs::rename(p->tmp, p->final_dir, ec);
        if (ec) throw Error(p->final_dir.string() + ": cannot rename the written checkpoint into place: " + ec.message());
      }
      fsync_directory(root.string());
      write_text_atomic((root / "latest").string(), p->final_dir.filename().string() + "\n");
      // Keep the newest `keep` of this run's checkpoints (names sort by step); a folder
      // that only looks like one (no manifest of this run) is not the run's to remove.
      std::vector<fs::path> steps;
      for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
        if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0 &&
            (e.path() == p->final_dir || ours(e.path().string())))
          steps.push_back(e.path());
      std::sort(steps.begin(), steps.end());
      for (std::size_t i = 0; i + static_cast<std::size_t>(options_.keep) < steps.size(); ++i)
        if (steps[i] != p->final_dir) fs::remove_all(steps[i], ec);
      fsync_directory(root.string());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  try {
    agree_on(world, error.empty() ? error : error + "; the previous checkpoint is intact");
  } catch (...) {
    cleanup();
    throw;
  }
  return p->final_dir.string();
}

std::string save_checkpoint(const std::string& dir, const Trainer& trainer, const RunState& state,
                            const ModelConfig& config, const ParallelLayout& layout, const SaveOptions& options) {
  CheckpointWriter w(dir, options);
  w.start(trainer, state, config, layout);
  return w.finish(*trainer.model().groups().world);
}

bool has_checkpoint(const std::string& dir) {
  try {
    (void)resolve_checkpoint(dir);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}

void prepare_save_folder(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    throw InvalidArgument("checkpoint folder '" + dir + "' exists and is not a folder (a file or a device); choose a folder for --save-dir");
  fs::create_directories(root, ec);
  if (!fs::is_directory(root)) {
    if (!ec) ec = std::make_error_code(std::errc::not_a_directory);
    throw InvalidArgument("checkpoint folder '" + dir + "' cannot be created: " + ec.message() +
                          "; choose another --save-dir");
  }
  // Whether files can be made in it (a read-only mount, no permission): a probe.
  const std::string probe = (root / (".probe-" + std::to_string(::getpid()) + ".tmp")).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InvalidArgument("checkpoint folder '" + dir + "' cannot be written: " + std::strerror(errno) +
                          "; choose another --save-dir");
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string resolve_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  refuse_special_file(root / "manifest.json", "the checkpoint's manifest (manifest.json)");
  if (fs::is_regular_file(root / "manifest.json", ec)) return root.string();
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    bad_checkpoint("'" + dir + "' is a file, not a checkpoint folder (the folder given to `train --save-dir`, "
                   "holding `latest` and step-N folders, or one of its step-N folders, holding manifest.json)");
  if (!fs::is_directory(root, ec)) bad_checkpoint("folder '" + dir + "' does not exist");
  refuse_special_file(root / "latest", "the name of the newest step folder (latest)");
  std::ifstream in(root / "latest", std::ios::binary);
  if (!in) bad_checkpoint("folder '" + dir + "' holds no checkpoint (no 'latest' file, no manifest.json)");
  std::string name(256, '\0');
  in.read(name.data(), static_cast<std::streamsize>(name.size()));
  name.resize(static_cast<std::size_t>(in.gcount()));
  if (!name.empty() && name.back() == '\n') name.pop_back();
  const std::string latest = (root / "latest").string();
  bool printable = !name.empty();
  for (unsigned char ch : name) printable = printable && ch > 0x20 && ch < 0x7f;
  if (!printable || name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
    bad_checkpoint("'" + latest + "' is damaged: it holds " + quote_name(name) + ", not a step folder's name");
  refuse_special_file(root / name / "manifest.json", "the checkpoint's manifest (manifest.json)");
  if (!fs::is_regular_file(root / name / "manifest.json", ec))
    bad_checkpoint("'" + latest + "' names " + name + ", which holds no manifest.json");
  return (root / name).string();
}

nlohmann::json read_checkpoint_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  refuse_special_file(path, "the checkpoint's manifest (manifest.json)");
  std::ifstream in(path);
  if (!in) bad_checkpoint("manifest '" + path + "' cannot be read");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    bad_checkpoint("manifest '" + path + "' is not valid JSON (" + e.what() + ")");
  }
  auto need = [&](const char* key, bool number) {
    if (!j.is_object() || !j.contains(key) || (number && !j[key].is_number_integer()))
      bad_checkpoint("manifest '" + path + "': missing or invalid field '" + key + "'");
  };
  if (!j.is_object() || j.value("format", std::string()) != kFormat)
    bad_checkpoint("manifest '" + path + "' is not a peakbound checkpoint");
  need("version", true);
  if (j["version"].get<int>() != kVersion)
    bad_checkpoint("manifest '" + path + "' has version " + j["version"].dump() + "; this build reads version " +
                   std::to_string(kVersion));
  for (const char* k : {"step", "sequences_consumed", "optimizer_steps"}) need(k, true);
  if (j["step"].get<std::int64_t>() < j["optimizer_steps"].get<std::int64_t>() || j["optimizer_steps"].get<std::int64_t>() < 0)
    bad_checkpoint("manifest '" + path + "': step " + j["step"].dump() + " and optimizer_steps " +
                   j["optimizer_steps"].dump() + " do not fit together");
  need("files", false);
  if (!j["files"].is_array() || j["files"].empty()) bad_checkpoint("manifest '" + path + "' lists no files");
  for (const nlohmann::json& f : j["files"])
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("crc32") || !f["crc32"].is_string() ||
        f["name"].get<std::string>().find('/') != std::string::npos)
      bad_checkpoint("manifest '" + path + "': a malformed entry in 'files': " + f.dump());
  return j;
}

namespace {

struct Piece {
  const SafeTensorsFile* file;
  std::string stored;  // the tensor's name in the file
  std::uint64_t begin, count;
  std::vector<std::int64_t> shape;
};

// name (HF name + suffix) -> the pieces holding parts of it.
using PieceIndex = std::map<std::string, std::vector<Piece>>;

void index_file(const SafeTensorsFile& f, PieceIndex& index) {
  for (const SafeTensorInfo& t : f.tensors()) {
    const auto it = f.metadata().find(t.name);
    if (it == f.metadata().end()) bad_checkpoint("file '" + f.path() + "': tensor " + t.name + " has no placement");
    nlohmann::json p;
    try {
      p = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception&) {
      bad_checkpoint("file '" + f.path() + "': tensor " + t.name + " has a malformed placement");
    }
    if (!p.is_object() || !p.contains("begin") || !p["begin"].is_number_unsigned() || !p.contains("shape") ||
        !p["shape"].is_array() || t.dtype != "F32" || t.shape.size() != 1)
      bad_checkpoint("file '" + f.path() + "': tensor " + t.name + " has a malformed placement or dtype");
    Piece pc{&f, t.name, p["begin"].get<std::uint64_t>(), static_cast<std::uint64_t>(t.shape[0]),
             p["shape"].get<std::vector<std::int64_t>>()};
    index[t.name].push_back(std::move(pc));
  }
}

// Every file of the manifest checked (present, size, CRC-32) before any byte of it is
// used; the safetensors among them opened.
std::vector<SafeTensorsFile> open_checked(const std::string& step_dir, const nlohmann::json& manifest) {
  std::vector<SafeTensorsFile> files;
  files.reserve(manifest["files"].size());
  for (const nlohmann::json& f : manifest["files"]) {
    const std::string path = (fs::path(step_dir) / f["name"].get<std::string>()).string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) bad_checkpoint("file '" + path + "' is missing");
    const FileSum s = file_sum(path);
    if (s.bytes != f["bytes"].get<std::uint64_t>())
      bad_checkpoint("file '" + path + "' is truncated or altered: " + std::to_string(s.bytes) +
                     " bytes, the manifest says " + std::to_string(f["bytes"].get<std::uint64_t>()));
    if (hex32(s.crc) != f["crc32"].get<std::string>())
      bad_checkpoint("file '" + path + "' is corrupted: CRC-32 " + hex32(s.crc) + ", the manifest says " +
                     f["crc32"].get<std::string>());
    if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
      files.push_back(SafeTensorsFile::open(path));
  }
  return files;
}

// Fills dst[seg.shard_offset ...] from the pieces of name; returns the elements filled.
std::uint64_t fill(const PieceIndex& index, const std::string& name, const ShardSegment& seg, float* dst) {
  const auto it = index.find(name);
  if (it == index.end()) return 0;
  std::uint64_t filled = 0;
  for (const Piece& p : it->second) {
    if (p.shape != seg.shape) {
      // "AxB" (appended, not "x" + ...: GCC 12 warns -Wrestrict on that insert at 0).
      const auto text = [](const auto& shape) {
        std::string s;
        for (auto d : shape) {
          if (!s.empty()) s += 'x';
          s += std::to_string(d);
        }
        return s;
      };
      bad_checkpoint("tensor " + seg.name + " is " + text(p.shape) + " in '" + p.file->path() + "', the model's is " +
                     text(seg.shape));
    }
    const std::uint64_t a = std::max(p.begin, seg.begin), b = std::min(p.begin + p.count, seg.begin + seg.count);
    if (a >= b) continue;
    const std::span<const std::byte> bytes = p.file->bytes(p.stored);
    const auto* src = reinterpret_cast<const float*>(bytes.data());
    std::copy(src + (a - p.begin), src + (b - p.begin), dst + seg.shard_offset + (a - seg.begin));
    check_finite_weights(dst + seg.shard_offset + (a - seg.begin), b - a, name, p.file->path(), a);  // NaN / inf
    filled += b - a;
  }
  return filled;
}

}  // namespace

RunState load_checkpoint(const std::string& step_dir, Trainer& trainer) {
  Communicator& world = *trainer.model().groups().world;
  const std::uint64_t n = trainer.shard_elements();
  std::vector<float> master(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<std::vector<float>> router;  // the router buffers, in router_buffers() order
  RunState st;
  std::int64_t optimizer_steps = 0;
  std::string error;
  try {
    const nlohmann::json j = read_checkpoint_manifest(step_dir);
    st.step = j["step"].get<std::int64_t>();
    st.sequences_consumed = j["sequences_consumed"].get<std::int64_t>();
    st.seed = j.value("seed", std::uint64_t{0});
    if (j.contains("run")) st.run = j["run"];
    st.run_id = manifest_run_id(j).value_or("");
    optimizer_steps = j["optimizer_steps"].get<std::int64_t>();
    const std::vector<SafeTensorsFile> files = open_checked(step_dir, j);
    PieceIndex index;
    for (const SafeTensorsFile& f : files) index_file(f, index);
    for (const ShardSegment& seg : trainer.shard_segments()) {
      const std::uint64_t got[3] = {fill(index, seg.name, seg, master.data()),
                                    fill(index, seg.name + ".exp_avg", seg, m.data()),
                                    fill(index, seg.name + ".exp_avg_sq", seg, v.data())};
      for (std::uint64_t g : got)
        if (g != seg.count)
          bad_checkpoint("'" + step_dir + "' does not hold tensor " + seg.name + " elements [" +
                         std::to_string(seg.begin) + ", " + std::to_string(seg.begin + seg.count) +
                         ") (another model, or files missing from it)");
    }
    // The router buffers, whole on every rank.
    const auto E = static_cast<std::uint64_t>(trainer.model().config().num_experts);
    for (const auto& [name, values] : trainer.model().router_buffers()) {
      (void)values;
      router.emplace_back(E, 0.0f);
      const ShardSegment whole{name, {static_cast<std::int64_t>(E)}, 0, E, 0};
      if (fill(index, name, whole, router.back().data()) != E)
        bad_checkpoint("'" + step_dir + "' does not hold router buffer " + name +
                       " exactly once (another model, or files missing from it)");
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // Agreed: every rank throws the lowest failing rank's message (printed once).
  agree_on(world, error);
  trainer.restore(master.data(), m.data(), v.data(), optimizer_steps, st.step);
  Device& dev = trainer.model().experts().device();
  std::size_t k = 0;
  for (const auto& [name, values] : trainer.model().router_buffers()) {
    dev.memcpy_async(values, router[k].data(), router[k].size() * sizeof(float), CopyKind::host_to_device,
                     dev.copy_stream());
    ++k;
  }
  dev.synchronize(dev.copy_stream());
  return st;
}

DType export_hf(const std::string& step_dir, const std::string& out_dir, std::optional<DType> dtype) {
  const nlohmann::json j = read_checkpoint_manifest(step_dir);
  const fs::path config_path = fs::path(step_dir) / "config.json";
  bool has_config = false;
  for (const nlohmann::json& f : j["files"]) has_config = has_config || f["name"] == "config.json";
  if (!has_config)
    bad_checkpoint("'" + step_dir + "' holds no config.json: its model (" +
                   (j.contains("model") && j["model"].contains("name") ? j["model"]["name"].dump() : std::string("?")) +
                   ") is a preset, for which transformers has no model type; export needs a run started from a "
                   "Hugging Face directory (--model DIR)");
  const std::vector<SafeTensorsFile> files = open_checked(step_dir, j);
  const ModelConfig config = load_hf_config(config_path.string());
  PieceIndex index;
  for (const SafeTensorsFile& f : files) index_file(f, index);
  std::ifstream in(config_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  // The default is the dtype of the Hugging Face model the run started from (load_hf_config parsed it already).
  HfModelWriter writer(dtype.value_or(hf_config_dtype(nlohmann::json::parse(text.str()))));
  const TensorTable table(config);  // the checkpoint's names (gpt-oss: its fused experts)
  std::vector<float> whole_tensor;  // one tensor at a time, stored by the writer in its dtype
  // gpt-oss: the run holds each expert as one packed row (TableLayout::trainer); a layer's
  // four fused tensors are rebuilt from them (train/gpt_oss_experts.h) at its first one.
  std::map<std::string, std::vector<float>> fused;
  const TensorTable trainer(config, TableLayout::trainer);
  auto fuse_layer = [&](std::int64_t layer) {
    const std::int64_t E = config.num_experts, H = config.hidden_size, F = config.moe_intermediate_size;
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    std::vector<float>& gu = fused[p + "gate_up_proj"];
    std::vector<float>& gub = fused[p + "gate_up_proj_bias"];
    std::vector<float>& d = fused[p + "down_proj"];
    std::vector<float>& db = fused[p + "down_proj_bias"];
    gu.assign(static_cast<std::size_t>(E * H * 2 * F), 0.0f);
    gub.assign(static_cast<std::size_t>(E * 2 * F), 0.0f);
    d.assign(static_cast<std::size_t>(E * F * H), 0.0f);
    db.assign(static_cast<std::size_t>(E * H), 0.0f);
    std::vector<float> packed(static_cast<std::size_t>(gpt_oss_expert_floats(H, F)), 0.0f);
    for (std::int64_t x = 0; x < E; ++x) {
      std::uint64_t at = 0;
      for (const TensorTemplate& t : trainer.expert_tensors()) {
        const std::string name = p + std::to_string(x) + "." + t.name;
        const auto n = static_cast<std::uint64_t>(t.numel);
        ShardSegment whole{name, t.shape, 0, n, 0};
        if (fill(index, name, whole, packed.data() + at) != n)
          bad_checkpoint("'" + step_dir + "' does not hold every element of " + name + " exactly once");
        at += n;
      }
      gpt_oss_unpack_expert(packed.data(), gu.data() + x * H * 2 * F, gub.data() + x * 2 * F, d.data() + x * F * H,
                            db.data() + x * H, H, F);
    }
  };
  for (const TensorEntry& e : table.entries()) {
    if (hf_ignored_tensor(config, e.name)) continue;
    if (trainer.converts_experts() && e.kind == TensorKind::expert) {
      if (!fused.count(e.name)) fuse_layer(e.layer);
      writer.add(e.name, e.shape, fused.at(e.name));
      fused.erase(e.name);
      continue;
    }
    ShardSegment whole{e.name, e.shape, 0, static_cast<std::uint64_t>(e.numel()), 0};
    whole_tensor.assign(static_cast<std::size_t>(e.numel()), 0.0f);
    if (fill(index, e.name, whole, whole_tensor.data()) != whole.count)
      bad_checkpoint("'" + step_dir + "' does not hold every element of " + e.name + " exactly once");
    writer.add(e.name, e.shape, whole_tensor);
  }
  writer.write(out_dir, text.str());
  return writer.dtype();
}

}  // namespace peakbound
