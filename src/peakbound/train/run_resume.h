// What a training run is, for its checkpoints and for a resume (issue 25): the settings
// that define the run (the model, the data or built-in task, the seed, the sequence
// length) must be the checkpoint's; the others (the steps, the save and eval cadence,
// the batch split, the learning rate, the schedules, the layout over ranks, which resumes
// exactly, and the precision: the checkpoint's master is fp32 in both, and a bf16 run
// computes with its rounding) may change and are said.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace peakbound {

// The content identity of a token file: {"path" (absolute), "bytes", "head_crc32" (of
// its first MiB)}; a copy of the file elsewhere has the same bytes and CRC.
nlohmann::json data_identity(const std::string& path);

// A new random run id (16 hex digits).
std::string new_run_id();

// `manifest`: the checkpoint's (read_checkpoint_manifest); `run`: this command's run
// record (RunState.run: "data" (data_identity, or null for the built-in task), "task",
// "symbols", "seq_len", "steps", ...); `model`: to_json of this command's model config;
// `seed`: --seed. Throws InvalidArgument, one line naming the flag, the checkpoint's
// value and the given one, when the command changes what defines the run. Returns one
// line for the user (or ""): what this command changes that may change, and what an
// older checkpoint did not record and so was not checked.
std::string check_resume(const nlohmann::json& manifest, const nlohmann::json& run, const nlohmann::json& model,
                         std::uint64_t seed);

}  // namespace peakbound
