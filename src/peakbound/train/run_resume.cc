#include "peakbound/train/run_resume.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/io/atomic_file.h"

namespace peakbound {

namespace fs = std::filesystem;

namespace {

std::string hex(std::uint64_t v, int digits) {
  char b[24];
  std::snprintf(b, sizeof b, "%0*llx", digits, static_cast<unsigned long long>(v));
  return b;
}

// A value as a user would type it.
std::string shown(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "none";
  return v.dump();
}

std::string describe_data(const nlohmann::json& d) {
  if (d.is_null()) return "the built-in task";
  return d.value("path", std::string("?")) + " (" + std::to_string(d.value("bytes", std::uint64_t{0})) +
         " bytes, CRC-32 of its first MiB " + d.value("head_crc32", std::string("?")) + ")";
}

}  // namespace

nlohmann::json data_identity(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) abs = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("--data " + path + ": cannot be read");
  std::vector<char> head(1 << 20);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  const std::uint32_t crc = crc32(head.data(), static_cast<std::size_t>(in.gcount()));
  const std::uintmax_t bytes = fs::file_size(path, ec);
  return {{"path", abs.lexically_normal().string()}, {"bytes", ec ? 0 : static_cast<std::uint64_t>(bytes)},
          {"head_crc32", hex(crc, 8)}};
}

std::string new_run_id() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return hex(v, 16);
}

std::string check_resume(const nlohmann::json& manifest, const nlohmann::json& run, const nlohmann::json& model,
                         std::uint64_t seed) {
  const nlohmann::json was = manifest.contains("run") && manifest["run"].is_object() ? manifest["run"]
                                                                                       : nlohmann::json::object();
  const auto refuse = [](const std::string& flag, const std::string& theirs, const std::string& given,
                         const std::string& fix) {
    throw InvalidArgument("--resume: " + flag + " changes the run: the checkpoint's run has " + theirs +
                          ", this command gives " + given + "; " + fix);
  };
  // The model: its config as trained (a path spelled otherwise, or a copy, is the same
  // model, and so is a Hugging Face folder renamed: the name is not compared). Fields one
  // side does not record (another version's config) are not compared.
  std::string field;
  if (manifest.contains("model") && manifest["model"].is_object())
    for (auto it = manifest["model"].begin(); it != manifest["model"].end() && field.empty(); ++it)
      if (it.key() != "name" && model.contains(it.key()) && model[it.key()] != it.value()) field = it.key();
  if (!field.empty()) {
    const nlohmann::json& m = manifest["model"];
    const std::string name = shown(m.value("name", nlohmann::json("?"))), now = shown(model.value("name", nlohmann::json("?")));
    refuse("--model", "model " + name + " (" + field + " " + shown(m[field]) + ")",
           now + " (" + field + " " + shown(model[field]) + ")",
           "give the checkpoint's model");
  }
  if (manifest.contains("seed") && manifest["seed"].is_number_unsigned() && manifest["seed"].get<std::uint64_t>() != seed)
    refuse("--seed", "seed " + manifest["seed"].dump(), std::to_string(seed),
           "give --seed " + manifest["seed"].dump() + " to continue it");
  if (was.contains("seq_len") && was["seq_len"] != run["seq_len"])
    refuse("--seq-len", "seq_len " + shown(was["seq_len"]), shown(run["seq_len"]),
           "give --seq-len " + shown(was["seq_len"]) + " to continue it");
  std::string unchecked;
  if (!was.contains("data")) {
    unchecked = "--data, --task and --symbols";
  } else {
    const nlohmann::json& d0 = was["data"];
    const nlohmann::json& d1 = run["data"];
    if (d0.is_null() != d1.is_null())
      refuse("--data", d0.is_null() ? "the built-in task " + shown(was.value("task", nlohmann::json("?"))) : describe_data(d0),
             d1.is_null() ? "the built-in task" : describe_data(d1),
             d0.is_null() ? "drop --data to continue it" : "give --data " + shown(d0.value("path", nlohmann::json("?"))));
    if (!d0.is_null() && (d0.value("bytes", std::uint64_t{0}) != d1.value("bytes", std::uint64_t{0}) ||
                          d0.value("head_crc32", std::string()) != d1.value("head_crc32", std::string())))
      refuse("--data", "read " + describe_data(d0), describe_data(d1) + ", other content",
             "give the file the run read (or a copy of it)");
    if (d0.is_null()) {
      for (const char* k : {"task", "symbols"})
        if (was.contains(k) && was[k] != run[k])
          refuse(std::string("--") + k, std::string(k) + " " + shown(was[k]), shown(run[k]),
                 std::string("give --") + k + " " + shown(was[k]) + " to continue it");
    }
  }
  // What may change: said, so nothing changes silently.
  std::string changed;
  const std::pair<const char*, const char*> knobs[] = {
      {"steps", "--steps"}, {"save_every", "--save-every"}, {"eval_every", "--eval-every"}, {"batch", "--batch"},
      {"accumulation", "--accumulation"}, {"lr", "--lr"}, {"schedules", "--schedules"}, {"ranks", "ranks"},
      {"cp", "--cp"}, {"ep", "--ep"}, {"vocab_group", "--vocab-group"},
      {"precision", "--precision"}};  // the checkpoint's master is fp32 in both precisions
  for (const auto& [key, flag] : knobs)
    if (was.contains(key) && run.contains(key) && was[key] != run[key])
      changed += std::string(changed.empty() ? "" : ", ") + flag + " " + shown(run[key]) + " (the checkpoint's run: " +
                 shown(was[key]) + ")";
  // A checkpoint from before the record of the precision was written by an f32 run.
  if (!was.contains("precision") && run.contains("precision") && run["precision"] != "f32")
    changed += std::string(changed.empty() ? "" : ", ") + "--precision " + shown(run["precision"]) +
               " (the checkpoint's run: f32)";
  if (!run["data"].is_null() && was.contains("data") && !was["data"].is_null() &&
      was["data"].value("path", std::string()) != run["data"].value("path", std::string()))
    changed += std::string(changed.empty() ? "" : ", ") + "--data " + run["data"].value("path", std::string()) +
               " (the checkpoint's run: " + was["data"].value("path", std::string()) + ", the same content)";
  std::string line;
  if (!changed.empty())
    line = "resume: this command's " + changed + "; the model, data, seed and sequence length are the checkpoint's";
  if (!unchecked.empty())
    line += std::string(line.empty() ? "" : "\n") + "resume: the checkpoint predates the record of " + unchecked +
            ": not checked (give the run's own)";
  return line;
}

}  // namespace peakbound
